//! Compiles the Tinker SDK's protobuf schema (`proto/tinker_public.proto`) into prost types.
//! protox parses it in Rust, so the build needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/tinker_public.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    // Ordered maps: loss inputs and metrics in a stable order, errors reproducible.
    prost_build::Config::new().btree_map(["."]).compile_fds(descriptors)?;
    Ok(())
}
