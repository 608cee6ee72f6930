"""Tier 1: tests of one part at a time, one folder per layer of proxy/ (and one for the addons),
in process, without a proxy process; ``test_layers.py`` holds the layers themselves."""
