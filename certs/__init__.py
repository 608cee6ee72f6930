"""CA handling: the proxy's own CA (generated, never committed) and the upstream trust bundle."""
