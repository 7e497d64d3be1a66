//! Scratch paths under the system's temporary directory, removed when dropped (a failing
//! test's too, as its panic unwinds), so that test runs leave nothing behind.

use std::ops::Deref;
use std::path::{Path, PathBuf};

/// A directory or file path of this test process, removed with all it holds when dropped.
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl Scratch {
    /// A fresh, empty directory of this process named after `name`.
    pub fn dir(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("tally-it-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    /// The path of a file of this process named after `name` (nothing is created); tests
    /// running side by side name theirs apart.
    pub fn file(name: &str) -> Self {
        Self(std::env::temp_dir().join(format!("tally-it-{}-{name}", std::process::id())))
    }
}

impl Deref for Scratch {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

/// For the standard library's path functions, borrowed: `std::fs::write(&scratch, …)`.
impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.0.is_dir() {
            let _ = std::fs::remove_dir_all(&self.0);
        } else {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}
