"""One module per subcommand. Each has HELP, DESCRIPTION, add_arguments(parser),
execute(args) -> dict (JSON-ready; 'exit_code' optional) and render(dict) -> str.
perfloop.cli lists them."""
