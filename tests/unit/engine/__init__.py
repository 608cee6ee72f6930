"""Unit tests of the engine: event dispatch, hardening, what the kernel says of addresses and
sockets (proxy/engine/)."""
