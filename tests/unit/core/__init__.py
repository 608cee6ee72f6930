"""Unit tests of the pure core (proxy/core/): tables and properties, no network, no mitmproxy."""
