#!/usr/bin/env bash
# Draws states.svg (docs/states.md) from states.dot with Graphviz's `dot`, so the docs site
# shows the diagram without loading a script from anywhere. Run it after editing states.dot.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dot -Tsvg "$here/states.dot" -o "$here/states.svg"
