"""Catalog entries a test appends to a copy of the shipped catalog.toml."""

# an entry that moves two knobs together (tile and occupancy)
TOGETHER_ENTRY = """
[[optimization]]
id = "tile_occupancy"
title = "a wider tile with more blocks per SM"
family = "tile"
knobs = ["tile", "occupancy"]
values = [{tile = [1, 2048], occupancy = 2}, {tile = [1, 4096], occupancy = 4},
          {tile = [1, 1024], occupancy = 4}]
applies_to = ["memory-bound"]
priority = { memory-bound = 0 }
"""
