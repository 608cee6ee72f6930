"""The pure core: what surrogate decides, computed from plain values.

Hosts and their patterns, canonical request paths, placeholders and their spellings, the policy
model (pools, egress rules, claims, credentials), decisions, substitution, scrubbing, bodies and
their decoding, request hygiene, limits bookkeeping, the parse halves of hook routes and OAuth
token capture, the kernel fence rules as text, and what a refusal tells each client (Proxy-Status
type, gRPC status). No I/O, no mitmproxy, no clock (the time is passed in), no threads: every
rule here is tested with tables, without a network.

May import: the standard library and the parsing libraries listed in ``tests/unit/test_layers.py``;
nothing else of ``proxy``. Nothing here is imported by ``proxy.core`` itself: import the modules.
"""
