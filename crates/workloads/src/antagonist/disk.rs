//! Disk antagonist (PerfIso's disk bully, DiskSPD-like): sequential, synchronous I/O, one
//! outstanding request per thread, 1 read for every 2 writes. Unbuffered (O_DIRECT) where the
//! file system supports it, otherwise O_DSYNC so writes still reach the device.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::{AntagonistError, RunState, Workload};

const ALIGN: usize = 4096;

/// A zeroed buffer aligned for O_DIRECT.
struct AlignedBuf {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: the buffer is plain memory owned by one thread at a time.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    fn new(len: usize) -> Self {
        let layout = Layout::from_size_align(len, ALIGN).expect("valid layout");
        // SAFETY: len > 0 (checked by the caller), layout is valid.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        AlignedBuf { ptr, layout }
    }
    fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr points to layout.size() initialised (zeroed) bytes we own.
        unsafe { std::slice::from_raw_parts(self.ptr, self.layout.size()) }
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr, self.layout) };
    }
}

pub struct Disk {
    files: Vec<File>,
    paths: Vec<PathBuf>,
    file_bytes: u64,
    block: usize,
    /// Whether the files were opened O_DIRECT.
    pub direct: bool,
}

impl Disk {
    pub fn create(
        dir: &Path,
        file_bytes: u64,
        block: usize,
        threads: usize,
    ) -> Result<Disk, AntagonistError> {
        if !dir.is_dir() {
            return Err(AntagonistError::Usage(format!(
                "--path {}: not an existing directory",
                dir.display()
            )));
        }
        if block == 0 || block > 64 << 20 {
            return Err(AntagonistError::Usage(format!(
                "--block-kb must give 1 byte .. 64 MiB, got {block} bytes"
            )));
        }
        if file_bytes < block as u64 {
            return Err(AntagonistError::Usage(format!(
                "--file-mb ({file_bytes} bytes) must hold at least one block ({block} bytes)"
            )));
        }
        let file_bytes = file_bytes / block as u64 * block as u64;
        let mut disk = Disk {
            files: Vec::new(),
            paths: Vec::new(),
            file_bytes,
            block,
            direct: block.is_multiple_of(ALIGN),
        };
        let mut buf = AlignedBuf::new(block);
        buf.as_mut_slice().fill(0xd5);
        for i in 0..threads {
            let path = dir.join(format!("headroom-disk-{}-{i}.dat", std::process::id()));
            // Registered before creation so Drop removes whatever got created.
            disk.paths.push(path.clone());
            let file = disk.open(&path)?;
            let mut off = 0u64;
            while off < file_bytes {
                file.write_all_at(buf.as_slice(), off)
                    .map_err(|e| AntagonistError::io(format!("filling {}", path.display()), e))?;
                off += block as u64;
            }
            disk.files.push(file);
        }
        Ok(disk)
    }

    fn open(&mut self, path: &Path) -> Result<File, AntagonistError> {
        let open = |flags: i32| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .custom_flags(flags)
                .open(path)
        };
        if self.direct {
            match open(libc::O_DIRECT) {
                Ok(f) => {
                    // Some file systems accept O_DIRECT at open and refuse the I/O: probe.
                    let probe = AlignedBuf::new(self.block);
                    if f.write_all_at(probe.as_slice(), 0).is_ok() {
                        return Ok(f);
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(e) => {
                    return Err(AntagonistError::io(
                        format!("creating {}", path.display()),
                        e,
                    ))
                }
            }
            self.direct = false;
        }
        open(libc::O_DSYNC)
            .map_err(|e| AntagonistError::io(format!("creating {}", path.display()), e))
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        for p in &self.paths {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Workload for Disk {
    fn detail(&self) -> String {
        format!(
            "{} files of {} KiB, {} KiB blocks, {}",
            self.files.len(),
            self.file_bytes >> 10,
            self.block >> 10,
            if self.direct {
                "O_DIRECT"
            } else {
                "O_DSYNC (O_DIRECT unsupported here)"
            }
        )
    }

    fn run_thread(&self, index: usize, state: &RunState) -> Result<(), AntagonistError> {
        let file = &self.files[index];
        let path = &self.paths[index];
        let mut buf = AlignedBuf::new(self.block);
        buf.as_mut_slice().fill(index as u8);
        let mut off = 0u64;
        let mut n = 0u64;
        while !state.stopped() {
            // r w w r w w …: 33% reads, 67% writes, both walking the file sequentially.
            if n.is_multiple_of(3) {
                file.read_exact_at(buf.as_mut_slice(), off).map_err(|e| {
                    AntagonistError::io(format!("reading {} at {off}", path.display()), e)
                })?;
            } else {
                file.write_all_at(buf.as_slice(), off).map_err(|e| {
                    AntagonistError::io(format!("writing {} at {off}", path.display()), e)
                })?;
            }
            n += 1;
            off += self.block as u64;
            if off >= self.file_bytes {
                off = 0;
            }
            state.add(1);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_created_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path;
        {
            let d = Disk::create(dir.path(), 64 << 10, 8 << 10, 2).unwrap();
            assert_eq!(d.files.len(), 2);
            path = d.paths[0].clone();
            assert_eq!(std::fs::metadata(&path).unwrap().len(), 64 << 10);
        }
        assert!(!path.exists());
        let e = Disk::create(Path::new("/nonexistent/dir"), 1 << 20, 4096, 1)
            .err()
            .unwrap();
        assert!(e.is_usage(), "{e}");
    }
}
