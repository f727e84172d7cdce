#!/usr/bin/env bash
# Refresh the vendored Swagger UI under static/vendor/swagger-ui/ from the npm registry.
# Usage: scripts/vendor-swagger-ui.sh [VERSION]   (default: the pinned version below)
# Only the browser bundle, its stylesheet and the licence files are kept; the pages load
# nothing from a CDN.
set -euo pipefail

VERSION="${1:-5.35.0}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="$ROOT/static/vendor/swagger-ui"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

(cd "$WORK" && npm pack --silent "swagger-ui-dist@$VERSION" >/dev/null)
tar -xzf "$WORK/swagger-ui-dist-$VERSION.tgz" -C "$WORK"

rm -rf "$DEST"
mkdir -p "$DEST"
for name in swagger-ui-bundle.js swagger-ui-bundle.js.LICENSE.txt swagger-ui.css LICENSE NOTICE; do
	cp "$WORK/package/$name" "$DEST/$name"
done
# The bundle points at a source map we do not ship; drop the comment so nothing asks for it.
sed -i '/^\/\/# sourceMappingURL=/d' "$DEST/swagger-ui-bundle.js"
sed -i 's|/\*# sourceMappingURL=[^*]*\*/||' "$DEST/swagger-ui.css"
echo "swagger-ui-dist $VERSION" > "$DEST/VERSION"
echo "Swagger UI $VERSION vendored into static/vendor/swagger-ui/"
