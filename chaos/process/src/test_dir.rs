//! A temporary directory for a test's data dirs and node logs that is deleted when the test passes
//! and kept (its path printed) when the test panics, so the logs of a failure can be read.

use std::path::Path;

/// A temporary directory, kept if the thread is panicking when it is dropped.
pub struct TestDir {
    dir: Option<tempfile::TempDir>,
}

impl TestDir {
    /// A fresh directory under the system temporary directory.
    pub fn new() -> anyhow::Result<TestDir> {
        Ok(TestDir { dir: Some(tempfile::Builder::new().prefix("tidal-procs-").tempdir()?) })
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        self.dir.as_ref().map(tempfile::TempDir::path).expect("the directory is only taken in drop")
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(dir) = self.dir.take() {
                eprintln!("test failed: node data dirs and logs kept in {}", dir.keep().display());
            }
        }
    }
}
