"""Tier 1: pure, table-driven tests of the core (proxy/), no network, no mitmproxy."""
