"""Every module in this package holds one rule; the engine finds them, nothing lists them."""
