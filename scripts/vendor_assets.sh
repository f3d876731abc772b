#!/usr/bin/env bash
# Copy the browser assets the book serves itself from npm packages into the static folder.
# usage: vendor_assets.sh NODE_MODULES DEST
set -euo pipefail
src=$1; dest=$2
rm -rf "$dest"; mkdir -p "$dest/mathjax" "$dest/html-manager" "$dest/ts-fsrs"
mj=$src/mathjax/es5
cp "$mj/tex-mml-chtml.js" "$dest/mathjax/"
for sub in input/tex/extensions output/chtml/fonts/woff-v2 ui a11y adaptors sre; do
  mkdir -p "$dest/mathjax/$sub"; cp -r "$mj/$sub/." "$dest/mathjax/$sub/"
done
hm=$src/@jupyter-widgets/html-manager/dist
cp "$hm/embed.js" "$dest/html-manager/"
cp "$hm"/*.woff2 "$hm"/*.woff "$hm"/*.ttf "$hm"/*.eot "$hm"/*.svg "$dest/html-manager/"
cp "$src/ts-fsrs/dist/index.umd.js" "$src/ts-fsrs/LICENSE" "$dest/ts-fsrs/"
