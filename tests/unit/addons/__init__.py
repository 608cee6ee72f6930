"""Unit tests of single addons against mitmproxy's own test flows and layers (addons/)."""
