"""surrogate's core: rules, host matching, placeholders, substitution, decisions, CLI.

The pure parts import nothing from mitmproxy; ``engine`` embeds it.
"""
