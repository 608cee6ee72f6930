"""Unit tests of the control plane in process: the API over a real store, its validation
(proxy/control/)."""
