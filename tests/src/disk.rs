//! A small disk that can be filled: a size-limited tmpfs mounted for a test, so a process
//! whose files live on it meets a real `ENOSPC` from the kernel when [`Tmpfs::fill`] takes the
//! last of its space, and goes on once [`Tmpfs::free`] gives it back.
//!
//! Invariant: the mount lives as long as the value; dropping it unmounts (lazily, so a process
//! still holding files there does not keep it mounted).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};

pub struct Tmpfs {
    at: PathBuf,
}

impl Tmpfs {
    /// Whether this machine lets a test mount a file system (root).
    pub fn available() -> bool {
        crate::netns::Network::available()
    }

    /// A tmpfs of `mb` MiB mounted at `at` (created if needed).
    pub fn mount(at: &Path, mb: u64) -> Result<Tmpfs> {
        std::fs::create_dir_all(at)?;
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mb}m"), "tmpfs"])
            .arg(at)
            .status()
            .context("running mount")?;
        ensure!(
            status.success(),
            "mount tmpfs at {}: {status}",
            at.display()
        );
        Ok(Tmpfs {
            at: at.to_path_buf(),
        })
    }

    fn filler(&self) -> PathBuf {
        self.at.join("filler")
    }

    /// Takes every byte still free: writes a filler file until the kernel says `ENOSPC`.
    /// Returns how many bytes it took.
    pub fn fill(&self) -> Result<u64> {
        let mut f = File::options()
            .create(true)
            .append(true)
            .open(self.filler())?;
        let mut taken = 0u64;
        for chunk in [1 << 20, 64 << 10, 4 << 10, 512] {
            let bytes = vec![0xA5u8; chunk];
            loop {
                match f.write(&bytes) {
                    Ok(0) => break,
                    Ok(n) => taken += n as u64,
                    Err(e) if e.raw_os_error() == Some(28) => break,
                    Err(e) => return Err(e.into()),
                }
            }
        }
        f.sync_all().ok();
        Ok(taken)
    }

    /// Gives back what [`Tmpfs::fill`] took.
    pub fn free(&self) -> Result<()> {
        std::fs::remove_file(self.filler()).or_else(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Ok(()),
            _ => Err(e),
        })?;
        Ok(())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
    }
}
