#!/bin/sh
# Refresh the vendored tus-js-client from the npm registry (the file manager's resumable
# uploads). Bump VERSION, run this script from anywhere, review the diff and commit.
set -eu

VERSION=4.3.1
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

cd "$WORK"
npm pack --silent "tus-js-client@$VERSION" >/dev/null
tar -xzf "tus-js-client-$VERSION.tgz"
mkdir -p "$HERE/tus-js-client"
# The source map is left out: the page never loads it.
sed '/^\/\/# sourceMappingURL=/d' package/dist/tus.min.js >"$HERE/tus-js-client/tus.min.js"
cp package/LICENSE "$HERE/tus-js-client/LICENSE"
echo "$VERSION" >"$HERE/tus-js-client/VERSION"
echo "tus-js-client $VERSION vendored into $HERE/tus-js-client"
