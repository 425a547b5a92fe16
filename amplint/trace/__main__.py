"""`python -m amplint.trace [OPTIONS] train.py ARGS`."""

from .command import trace

if __name__ == "__main__":
    trace.main(prog_name="python -m amplint.trace")
