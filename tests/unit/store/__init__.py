"""Unit tests of the credential store, its keys, live values and node-wide counters (proxy/store/)."""
