from perfloop.cli import main

raise SystemExit(main())
