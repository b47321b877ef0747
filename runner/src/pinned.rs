//! Which file an attempt may run: one under the runner's pipeline root
//! (`--pipelines`) whose sha256 is the one its version was registered with.
//! A bare name is a file in the root, never a PATH lookup; a symlink counts
//! where it points.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use crate::control::Lease;

#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error("binary {path} is outside this runner's pipeline root {root} (--pipelines)")]
    Outside { path: String, root: String },
    #[error("binary {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "binary {path} has sha256 {found}, but version {version} of pipeline {pipeline} was \
         registered with sha256 {expected}: install the registered binary, or register this \
         one (orca register)"
    )]
    Mismatch {
        path: String,
        found: String,
        expected: String,
        version: i64,
        pipeline: String,
    },
    #[error(
        "version {version} of pipeline {pipeline} was registered without its binary's sha256 \
         (before Orca 0.2.0?): register it again with orca register, or let this runner run \
         unpinned versions (--allow-unpinned)"
    )]
    Unpinned { version: i64, pipeline: String },
}

/// What a file looked like when it was hashed: a file rewritten, renamed
/// over or touched since then has another ctime (which no user can set).
#[derive(Clone, PartialEq, Eq)]
struct Seen {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

/// The pipeline root and the hashes of the binaries run so far.
pub struct Pins {
    root: PathBuf,
    allow_unpinned: bool,
    /// Each binary's hash as last read, behind a lock of its own, held
    /// while it is hashed: slots that claim attempts of one new binary at
    /// once hash it once, the others wait and find its hash (a release
    /// pipeline binary is 100-200 MB, a core's tenth of a second each).
    hashed: Mutex<HashMap<PathBuf, Arc<Mutex<Option<Hashed>>>>>,
    /// How many times a binary was read whole to be hashed (what the tests
    /// look at).
    #[cfg_attr(not(test), allow(dead_code))]
    hashes: AtomicUsize,
}

/// A binary's file as it was when it was hashed, and its hash.
type Hashed = (Seen, String);

/// A binary that passed: its real path, and whether it was run unpinned.
#[derive(Debug)]
pub struct Verified {
    pub path: PathBuf,
    pub unpinned: bool,
}

impl Pins {
    /// `root` must exist; it is resolved once, symlinks and all.
    pub fn new(root: &Path, allow_unpinned: bool) -> std::io::Result<Pins> {
        Ok(Pins {
            root: root.canonicalize()?,
            allow_unpinned,
            hashed: Mutex::new(HashMap::new()),
            hashes: AtomicUsize::new(0),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file to run for a lease, or why it may not run.
    pub fn verify(&self, l: &Lease) -> Result<Verified, PinError> {
        self.verify_binary(
            &l.binary_path,
            l.binary_sha256.as_deref(),
            l.version.0,
            &l.pipeline,
        )
    }

    /// The file to run for a binary of version `version` of `pipeline`
    /// (an attempt's, or a task batch's), or why it may not run.
    pub fn verify_binary(
        &self,
        binary_path: &str,
        binary_sha256: Option<&str>,
        version: i64,
        pipeline: &str,
    ) -> Result<Verified, PinError> {
        let named = Path::new(binary_path);
        let joined = if named.is_absolute() {
            named.to_path_buf()
        } else {
            self.root.join(named)
        };
        let io = |source| PinError::Io {
            path: joined.display().to_string(),
            source,
        };
        let path = joined.canonicalize().map_err(io)?;
        if !path.starts_with(&self.root) {
            return Err(PinError::Outside {
                path: path.display().to_string(),
                root: self.root.display().to_string(),
            });
        }
        let Some(expected) = binary_sha256 else {
            if self.allow_unpinned {
                return Ok(Verified {
                    path,
                    unpinned: true,
                });
            }
            return Err(PinError::Unpinned {
                version,
                pipeline: pipeline.to_string(),
            });
        };
        let found = self.sha256(&path).map_err(io)?;
        if found != expected {
            return Err(PinError::Mismatch {
                path: path.display().to_string(),
                found,
                expected: expected.to_string(),
                version,
                pipeline: pipeline.to_string(),
            });
        }
        Ok(Verified {
            path,
            unpinned: false,
        })
    }

    /// Hashes the executable files at the top of the root, at most
    /// `most`, largest first, so that the first attempts of a runner just
    /// started find their binaries' hashes (a release pipeline binary is a
    /// core's tenth of a second or more). Files it cannot read are left to
    /// the attempts that name them. Returns how many files and bytes it
    /// hashed.
    pub fn warm(&self, most: usize) -> (usize, u64) {
        use std::os::unix::fs::PermissionsExt;
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return (0, 0);
        };
        let mut files: Vec<(u64, PathBuf)> = entries
            .filter_map(|e| {
                let path = e.ok()?.path().canonicalize().ok()?;
                let m = std::fs::metadata(&path).ok()?;
                (path.starts_with(&self.root) && m.is_file() && m.permissions().mode() & 0o111 != 0)
                    .then_some((m.len(), path))
            })
            .collect();
        files.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        files.dedup_by(|a, b| a.1 == b.1);
        let (mut n, mut bytes) = (0, 0);
        for (len, path) in files.into_iter().take(most) {
            if self.sha256(&path).is_ok() {
                n += 1;
                bytes += len;
            }
        }
        (n, bytes)
    }

    fn sha256(&self, path: &Path) -> std::io::Result<String> {
        // A cache only: a lock a panicking thread left is still usable.
        let entry = self
            .hashed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(path.to_path_buf())
            .or_default()
            .clone();
        let mut known = entry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut file = std::fs::File::open(path)?;
        let seen = seen(&file.metadata()?);
        if let Some((s, h)) = known.as_ref() {
            if *s == seen {
                return Ok(h.clone());
            }
        }
        self.hashes.fetch_add(1, Ordering::Relaxed);
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = file.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        let hash = hex(&hasher.finalize());
        // Changed while it was read: hash it again next time.
        *known = (seen == self::seen(&file.metadata()?)).then(|| (seen, hash.clone()));
        Ok(hash)
    }
}

fn seen(m: &std::fs::Metadata) -> Seen {
    Seen {
        dev: m.dev(),
        ino: m.ino(),
        len: m.len(),
        mtime: (m.mtime(), m.mtime_nsec()),
        ctime: (m.ctime(), m.ctime_nsec()),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use orca_core::api::{AttemptId, Command, LeaseToken, RunId, VersionId};

    fn lease(binary: &str, sha: Option<&str>) -> Lease {
        Lease {
            attempt: AttemptId(1),
            run: RunId(1),
            lease: "00000000-0000-0000-0000-000000000001"
                .parse::<LeaseToken>()
                .expect("token"),
            pipeline: "lake".into(),
            version: VersionId(3),
            binary_path: binary.into(),
            partitions: vec![],
            attempt_number: 1,
            deadline: chrono::Utc::now(),
            registry_hash: "h".into(),
            pool: "default".into(),
            org: "default".into(),
            command: Command::Attempt,
            binary_sha256: sha.map(str::to_string),
            resources: None,
            image: None,
        }
    }

    #[test]
    fn only_files_under_the_root_with_the_registered_hash_run() {
        let dir = std::env::temp_dir().join(format!("orca-pins-{}", std::process::id()));
        let root = dir.join("root");
        std::fs::create_dir_all(&root).expect("root");
        std::fs::write(root.join("lake"), b"binary one").expect("write");
        std::fs::write(dir.join("outside"), b"binary one").expect("write");
        std::os::unix::fs::symlink(dir.join("outside"), root.join("link")).expect("symlink");
        let good = hex(&Sha256::digest(b"binary one"));
        let pins = Pins::new(&root, false).expect("pins");

        let ok = pins
            .verify(&lease("lake", Some(&good)))
            .expect("bare name in the root");
        assert_eq!(ok.path, pins.root().join("lake"));
        let abs = root.join("lake").display().to_string();
        assert!(pins.verify(&lease(&abs, Some(&good))).is_ok());

        let e = pins
            .verify(&lease(&abs, Some(&"0".repeat(64))))
            .expect_err("refused");
        let msg = e.to_string();
        assert!(
            matches!(e, PinError::Mismatch { .. }) && msg.contains(&good) && msg.contains("lake"),
            "{msg}"
        );
        for escape in [
            dir.join("outside").display().to_string(),
            "../outside".to_string(),
            "link".to_string(),
            "/bin/sh".to_string(),
        ] {
            let e = pins
                .verify(&lease(&escape, Some(&good)))
                .expect_err("refused");
            assert!(matches!(e, PinError::Outside { .. }), "{escape}: {e}");
        }
        // "true" is on PATH, never looked up there.
        let e = pins
            .verify(&lease("true", Some(&good)))
            .expect_err("refused");
        assert!(matches!(e, PinError::Io { .. }), "{e}");
        let e = pins.verify(&lease("lake", None)).expect_err("refused");
        assert!(matches!(e, PinError::Unpinned { .. }), "{e}");
        let lax = Pins::new(&root, true).expect("pins");
        assert!(lax.verify(&lease("lake", None)).is_ok_and(|v| v.unpinned));

        // Rewritten after it was hashed: the new bytes are hashed again.
        std::fs::write(root.join("lake"), b"binary two").expect("rewrite");
        let e = pins
            .verify(&lease("lake", Some(&good)))
            .expect_err("refused");
        assert!(matches!(e, PinError::Mismatch { .. }), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Slots claiming attempts of one new binary at once read it once.
    #[test]
    fn a_binary_verified_by_several_slots_at_once_is_hashed_once() {
        let dir = std::env::temp_dir().join(format!("orca-pins-once-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("root");
        let bytes = vec![7u8; 8 << 20];
        std::fs::write(dir.join("lake"), &bytes).expect("write");
        let good = hex(&Sha256::digest(&bytes));
        let pins = Pins::new(&dir, false).expect("pins");
        let barrier = std::sync::Barrier::new(4);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    barrier.wait();
                    pins.verify(&lease("lake", Some(&good))).expect("verified");
                });
            }
        });
        assert_eq!(pins.hashes.load(Ordering::Relaxed), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A runner that warmed its root hashes nothing when its first
    /// attempts claim; files that are not executables, or not in the root,
    /// are not read.
    #[test]
    fn a_warmed_root_leaves_its_binaries_hashed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("orca-pins-warm-{}", std::process::id()));
        let root = dir.join("root");
        std::fs::create_dir_all(root.join("sub")).expect("root");
        let exe = |p: &Path, bytes: &[u8]| {
            std::fs::write(p, bytes).expect("write");
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        };
        exe(&root.join("lake"), b"lake binary");
        exe(&root.join("labels"), b"labels binary, longer");
        exe(&root.join("sub/deeper"), b"not at the top");
        exe(&dir.join("outside"), b"outside the root");
        std::os::unix::fs::symlink(dir.join("outside"), root.join("link")).expect("symlink");
        std::os::unix::fs::symlink(root.join("lake"), root.join("alias")).expect("symlink");
        std::fs::write(root.join("notes.txt"), b"not an executable").expect("write");
        let pins = Pins::new(&root, false).expect("pins");

        assert_eq!(pins.warm(1), (1, 21), "the largest first, at most one");
        assert_eq!(
            pins.warm(10),
            (2, 32),
            "lake once, though two names lead to it"
        );
        assert_eq!(pins.hashes.load(Ordering::Relaxed), 2);
        let good = hex(&Sha256::digest(b"lake binary"));
        pins.verify(&lease("lake", Some(&good))).expect("verified");
        assert_eq!(pins.hashes.load(Ordering::Relaxed), 2, "already hashed");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
