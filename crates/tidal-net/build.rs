//! Compiles proto/tidal.proto with protox (pure Rust), so no system protoc is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Read when the script runs, not baked in when it is compiled: checkouts of the same workspace
    // that share a target directory share this script's binary.
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR")?;
    let proto_dir = std::path::Path::new(&manifest_dir).join("../../proto");
    let proto = proto_dir.join("tidal.proto");
    println!("cargo:rerun-if-changed={}", proto.display());
    let descriptors = protox::compile([&proto], [&proto_dir])?;
    // A pulled chunk's batches are `Bytes`: the server moves its read buffer in, the client's
    // decode slices the received buffer instead of copying it, and each `Batch` is a slice of that.
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .bytes(".tidal.v1.Batches.batches")
        .compile_fds(descriptors)?;
    Ok(())
}
