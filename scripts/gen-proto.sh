#!/usr/bin/env bash
# gen-proto.sh regenerates the Go code of Sluice's protobuf API
# (proto/**/*.pb.go) from the .proto sources under proto/.
#
# Usage: scripts/gen-proto.sh   (from any directory)
#
# It installs pinned versions of buf, protoc-gen-go and protoc-gen-go-grpc with
# `go install` into a per-version tools directory (only the first time), checks
# the sources with `buf format` and `buf lint`, then runs `buf generate` with
# local plugins only. Running it twice gives identical files.
#
# Environment:
#   SLUICE_TOOLS_DIR  where the tools are installed
#                     (default: ${XDG_CACHE_HOME:-$HOME/.cache}/sluice/tools)
set -euo pipefail

# Pinned tool versions. protoc-gen-go must match google.golang.org/protobuf in
# go.mod (checked below); protoc-gen-go-grpc's code needs grpc >= 1.64.
BUF_VERSION=v1.75.0
PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

tools="${SLUICE_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/tools}"

# install NAME PACKAGE VERSION installs PACKAGE@VERSION into its own directory
# unless it is there already, and prints the binary's path.
install() {
	local name=$1 pkg=$2 version=$3
	local dir="$tools/$name@$version"
	if [[ ! -x "$dir/$name" ]]; then
		echo "gen-proto: installing $pkg@$version" >&2
		mkdir -p "$dir"
		# Outside the module and with no GOFLAGS, so that neither go.mod nor the
		# caller's flags affect the build, and nothing is recorded in go.mod.
		(cd "$dir" && GOBIN="$dir" GOFLAGS= GOWORK=off go install "$pkg@$version") >&2
	fi
	echo "$dir"
}

gomod_protobuf="$(awk '$1 == "google.golang.org/protobuf" { print $2 }' go.mod)"
if [[ "$gomod_protobuf" != "$PROTOC_GEN_GO_VERSION" ]]; then
	echo "gen-proto: go.mod has google.golang.org/protobuf ${gomod_protobuf:-(none)} but" \
		"PROTOC_GEN_GO_VERSION is $PROTOC_GEN_GO_VERSION; make them equal in scripts/gen-proto.sh" >&2
	exit 1
fi

buf_dir="$(install buf github.com/bufbuild/buf/cmd/buf "$BUF_VERSION")"
go_dir="$(install protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go "$PROTOC_GEN_GO_VERSION")"
grpc_dir="$(install protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC_VERSION")"

# buf finds the plugins named in scripts/buf.gen.yaml on PATH: the pinned ones
# come first.
export PATH="$go_dir:$grpc_dir:$PATH"
buf="$buf_dir/buf"

"$buf" format --diff --exit-code || {
	echo "gen-proto: .proto files are not formatted; run: $buf format -w" >&2
	exit 1
}
"$buf" lint
"$buf" generate --template scripts/buf.gen.yaml

echo "gen-proto: generated:" >&2
find proto -name '*.pb.go' | sort >&2
