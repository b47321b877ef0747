//! A private copy of this machine's PostgreSQL installation, whose `orca`
//! extension files a test can swap as a package upgrade would, under a
//! running server.
//!
//! PostgreSQL finds its library and share directories relative to its own
//! binary (after following symlinks), so the binaries are copied; the other
//! libraries are linked, and the share directory, which holds the
//! extension's control file and scripts, is copied.

use std::path::{Path, PathBuf};
use std::process::Command;

fn pg_config(arg: &str) -> PathBuf {
    let pg_config = std::env::var("ORCA_PG_CONFIG")
        .unwrap_or_else(|_| "/usr/lib/postgresql/15/bin/pg_config".to_string());
    let out = Command::new(&pg_config)
        .arg(arg)
        .output()
        .unwrap_or_else(|e| panic!("run {pg_config}: {e}"));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// Where release libraries are built (scripts/setup.sh).
pub fn release_library(version: &str) -> Option<PathBuf> {
    let dir =
        std::env::var("ORCA_RELEASES_DIR").unwrap_or_else(|_| "/var/tmp/orca-releases".into());
    let p = PathBuf::from(dir).join(version).join("orca.so");
    p.exists().then_some(p)
}

/// This machine's installed extension files: what scripts/setup.sh installed.
pub fn installed_library() -> PathBuf {
    pg_config("--pkglibdir").join("orca.so")
}

pub fn installed_share() -> PathBuf {
    pg_config("--sharedir").join("extension")
}

pub struct Installation {
    pub root: PathBuf,
    pub bindir: PathBuf,
    pub libdir: PathBuf,
    pub extdir: PathBuf,
}

fn copy_dir(from: &Path, to: &Path) {
    let ok = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "cp -a {} {}", from.display(), to.display());
}

impl Installation {
    /// Copies the installation, without any `orca` extension files: the
    /// test installs the version it starts with.
    pub fn copy() -> Installation {
        let (bindir, libdir, sharedir) = (
            pg_config("--bindir"),
            pg_config("--pkglibdir"),
            pg_config("--sharedir"),
        );
        let root = std::env::temp_dir().join(format!("orca-pg-{}", uuid::Uuid::new_v4().simple()));
        let at = |p: &Path| root.join(p.strip_prefix("/").unwrap_or(p));
        let (new_bin, new_lib, new_share) = (at(&bindir), at(&libdir), at(&sharedir));
        for d in [&new_bin, &new_lib, &new_share] {
            if let Some(parent) = d.parent() {
                std::fs::create_dir_all(parent).expect("installation dirs");
            }
        }
        copy_dir(&bindir, &new_bin);
        copy_dir(&sharedir, &new_share);
        std::fs::create_dir_all(&new_lib).expect("lib dir");
        for e in std::fs::read_dir(&libdir)
            .expect("read the lib dir")
            .flatten()
        {
            let name = e.file_name();
            if name.to_string_lossy().starts_with("orca") {
                continue;
            }
            std::os::unix::fs::symlink(e.path(), new_lib.join(&name)).expect("link a library");
        }
        let extdir = new_share.join("extension");
        for e in std::fs::read_dir(&extdir)
            .expect("read the extension dir")
            .flatten()
        {
            if e.file_name().to_string_lossy().starts_with("orca") {
                std::fs::remove_file(e.path()).expect("remove an orca file");
            }
        }
        Installation {
            root,
            bindir: new_bin,
            libdir: new_lib,
            extdir,
        }
    }

    /// Puts a file into `dir` as a package manager does: written beside it
    /// under another name, then renamed over the old one, so that a running
    /// server never sees half a file.
    pub fn put(dir: &Path, name: &str, from: &Path) {
        let tmp = dir.join(format!(".{name}.new"));
        std::fs::copy(from, &tmp)
            .unwrap_or_else(|e| panic!("copy {} to {}: {e}", from.display(), tmp.display()));
        std::fs::rename(&tmp, dir.join(name)).expect("rename into place");
    }

    /// Installs a released version: its library (`library`), its install
    /// script from migrations/ and a control file whose default it is.
    pub fn install_release(&self, version: &str, library: &Path) {
        Installation::put(&self.libdir, "orca.so", library);
        let script = crate::releases::migrations_dir().join(format!("orca--{version}.sql"));
        Installation::put(&self.extdir, &format!("orca--{version}.sql"), &script);
        let control = std::fs::read_to_string(installed_share().join("orca.control"))
            .expect("the installed orca.control");
        let control: String = control
            .lines()
            .map(|l| {
                if l.starts_with("default_version") {
                    format!("default_version = '{version}'")
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        let tmp = self.root.join("orca.control");
        std::fs::write(&tmp, control + "\n").expect("write orca.control");
        Installation::put(&self.extdir, "orca.control", &tmp);
    }

    /// Installs this build, as scripts/setup.sh installed it on this
    /// machine: the library, the control file, every orca script.
    pub fn install_current(&self) {
        Installation::put(&self.libdir, "orca.so", &installed_library());
        let share = installed_share();
        for e in std::fs::read_dir(&share)
            .expect("read the extension dir")
            .flatten()
        {
            let name = e.file_name().to_string_lossy().to_string();
            if name.starts_with("orca") {
                Installation::put(&self.extdir, &name, &e.path());
            }
        }
    }
}

impl Drop for Installation {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
