"""gannet-arena: re-run published web-server studies against gannet and its peers, side by side."""

__version__ = "0.1.0"
