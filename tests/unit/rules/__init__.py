"""Unit tests of rules files and their value sources (proxy/rules/)."""
