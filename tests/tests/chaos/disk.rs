//! A small disk of its own for a world's store: a tmpfs of a few
//! megabytes mounted under the world's directory (the suite runs as root,
//! as CI does), which a fault fills to the last byte and later empties.
//! Where mounting is not allowed, a world keeps its store in the bucket.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The disk's size: room for a few minutes of two syncs' records and
/// staged epochs many times over.
const SIZE: &str = "64m";

pub struct Disk {
    pub mount: PathBuf,
}

impl Disk {
    /// Mounts a tmpfs at `at`; None (and why, printed) when it cannot.
    pub fn mount(at: &Path) -> Option<Disk> {
        std::fs::create_dir_all(at).ok()?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={SIZE}"), "tmpfs"])
            .arg(at)
            .output()
            .ok()?;
        if !out.status.success() {
            println!(
                "chaos: no disk of its own for the store ({}): the store stays in the bucket",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return None;
        }
        Some(Disk {
            mount: at.to_path_buf(),
        })
    }

    /// Fills the disk until a write finds no space; returns the filler.
    pub fn fill(&self) -> PathBuf {
        let filler = self.mount.join("filler");
        if let Ok(mut f) = std::fs::File::create(&filler) {
            for size in [1 << 20, 4096, 512] {
                let block = vec![0u8; size];
                while f.write_all(&block).is_ok() {}
            }
        }
        filler
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        // Lazily: a process that still holds a file in it lets go later.
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
    }
}
