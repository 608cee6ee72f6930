"""Unit tests of the CLI's dry runs: rules explain and audit why (proxy/cli/)."""
