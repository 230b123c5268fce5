#!/bin/sh
# Regenerates host/src/onnx/proto.rs from ONNX's `onnx.proto` with prost-build (and protox,
# a protobuf compiler in Rust, so no `protoc` is needed). Run from the repository root:
#
#   sh scripts/gen_onnx_proto.sh path/to/onnx.proto
#
# `onnx.proto` ships in the `onnx` Python package (site-packages/onnx/onnx.proto); the
# committed file was generated from onnx 1.23.2's with prost-build 0.14.4 and protox 0.9.1.
set -eu
proto=${1:?usage: gen_onnx_proto.sh path/to/onnx.proto}
root=$(pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src"
cp "$proto" "$work/onnx.proto"
cat > "$work/Cargo.toml" <<'TOML'
[package]
name = "onnx-proto-gen"
version = "0.1.0"
edition = "2021"
publish = false
[dependencies]
prost-build = "=0.14.4"
protox = "=0.9.1"
TOML
cat > "$work/src/main.rs" <<'RS'
fn main() {
    let fds = protox::compile(["onnx.proto"], ["."]).expect("onnx.proto compiles");
    std::fs::create_dir_all("out").expect("out directory");
    let mut config = prost_build::Config::new();
    config.out_dir("out");
    config.compile_fds(fds).expect("code generation");
}
RS
(cd "$work" && cargo run --quiet)
out="$root/host/src/onnx/proto.rs"
{
    sed -n '1,/^$/p' "$out"
    cat "$work/out/onnx.rs"
} > "$work/proto.rs"
mv "$work/proto.rs" "$out"
echo "wrote $out"
