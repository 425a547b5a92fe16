"""The lint engine: parses files, runs the rules it finds, applies fixes. It never imports
torch, the probe, or any particular rule."""
