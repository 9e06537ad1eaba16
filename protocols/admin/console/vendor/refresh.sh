#!/bin/sh
# Copy the console's browser libraries from the npm registry at the versions package.json and
# package-lock.json pin (checksums checked by `npm ci`): only the ES modules the page loads, the
# chart style sheet and each package's license. Run through `make console-vendor`.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$here/package.json" "$work/"
if [ -f "$here/package-lock.json" ]; then
    cp "$here/package-lock.json" "$work/"
    (cd "$work" && npm ci --no-audit --no-fund --ignore-scripts)
else
    (cd "$work" && npm install --no-audit --no-fund --ignore-scripts)
    cp "$work/package-lock.json" "$here/"
fi
m="$work/node_modules"
unmap() { sed '/^\/\/# sourceMappingURL=/d; s|//# sourceMappingURL=[^ ]*$||' "$1"; }
unmap "$m/preact/dist/preact.mjs" > "$here/preact.mjs"
# The hooks import preact by its bare name; the page has no import map (its CSP allows no
# inline script), so they import the file next to them.
unmap "$m/preact/hooks/dist/hooks.mjs" | sed 's|from"preact"|from"./preact.mjs"|g' > "$here/hooks.mjs"
if grep -q 'from"preact"' "$here/hooks.mjs" || ! grep -q 'from"./preact.mjs"' "$here/hooks.mjs"; then
    echo "refresh.sh: preact/hooks no longer imports preact as expected; fix the rewrite" >&2
    exit 1
fi
unmap "$m/htm/dist/htm.module.js" > "$here/htm.mjs"
unmap "$m/uplot/dist/uPlot.esm.js" > "$here/uPlot.mjs"
cp "$m/uplot/dist/uPlot.min.css" "$here/uPlot.min.css"
for package in preact htm uplot; do
    cp "$m/$package/LICENSE" "$here/LICENSE-$package"
done
echo "vendored: $(cd "$m" && for p in preact htm uplot; do printf '%s@%s ' "$p" "$(node -p "require('./$p/package.json').version")"; done)"
