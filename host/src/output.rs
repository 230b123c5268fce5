//! Outputs written whole or not at all, and checked before work starts.
//!
//! Every file Tessera writes (checkpoints, predictions, report files, the outputs of `run`,
//! sweep tables) is written to a temporary file in its target folder, flushed to disk and
//! renamed over the target: a reader sees the old file or the new one, never part of one,
//! and a failed write (a full disk, say) leaves the old file as it was and no temporary
//! behind. Renaming within a folder is atomic on the file systems Tessera runs on (POSIX
//! `rename`; `MoveFileEx` with replace on Windows, as `tempfile` does it).
//!
//! Where a command will write is checked before it starts its work ([`check_output_file`],
//! [`check_output_dir`]): a checkpoint into a missing folder or a report folder that is a file
//! is reported at once, not after a training run.

use std::fmt;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// Where an output cannot go.
#[derive(Debug)]
#[non_exhaustive]
pub enum OutputError {
    /// The output file's folder does not exist.
    MissingFolder {
        /// The output file.
        path: PathBuf,
        /// Its folder.
        folder: PathBuf,
    },
    /// Something that must be a folder is a file (or the like).
    NotAFolder {
        /// The output.
        path: PathBuf,
        /// What is not a folder.
        folder: PathBuf,
    },
    /// An output file's name is a folder.
    IsAFolder {
        /// The output file.
        path: PathBuf,
    },
    /// The folder does not take new files (permissions, a read-only file system).
    NotWritable {
        /// The output.
        path: PathBuf,
        /// The folder tried.
        folder: PathBuf,
        /// Why.
        source: io::Error,
    },
}

impl fmt::Display for OutputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutputError::MissingFolder { path, folder } => write!(
                f,
                "{}: cannot write there: the folder {} does not exist",
                path.display(),
                folder.display()
            ),
            OutputError::NotAFolder { path, folder } => write!(
                f,
                "{}: cannot write there: {} is not a folder",
                path.display(),
                folder.display()
            ),
            OutputError::IsAFolder { path } => {
                write!(f, "{}: is a folder; name a file to write", path.display())
            }
            OutputError::NotWritable {
                path,
                folder,
                source,
            } => write!(
                f,
                "{}: cannot write there: the folder {} takes no new file ({source})",
                path.display(),
                folder.display()
            ),
        }
    }
}

impl std::error::Error for OutputError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OutputError::NotWritable { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The folder a file at `path` goes in (`.` for a bare name).
fn folder_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Whether `folder` takes a new file: one is made there and removed.
fn takes_files(path: &Path, folder: &Path) -> Result<(), OutputError> {
    tempfile::Builder::new()
        .prefix(".tessera-check")
        .tempfile_in(folder)
        .map(drop)
        .map_err(|source| OutputError::NotWritable {
            path: path.to_path_buf(),
            folder: folder.to_path_buf(),
            source,
        })
}

/// Checks that a file can be written at `path`: its folder exists, is a folder and takes new
/// files, and `path` itself is not a folder. Nothing is left behind.
///
/// # Errors
///
/// [`OutputError`] naming `path` and what is wrong.
pub fn check_output_file(path: &Path) -> Result<(), OutputError> {
    if path.is_dir() {
        return Err(OutputError::IsAFolder {
            path: path.to_path_buf(),
        });
    }
    let folder = folder_of(path);
    if !folder.exists() {
        return Err(OutputError::MissingFolder {
            path: path.to_path_buf(),
            folder,
        });
    }
    if !folder.is_dir() {
        return Err(OutputError::NotAFolder {
            path: path.to_path_buf(),
            folder,
        });
    }
    takes_files(path, &folder)
}

/// Checks that `dir` can hold outputs: it is a folder that takes new files, or it does not
/// exist yet and its nearest existing ancestor is such a folder (the command makes the rest).
/// Nothing is left behind.
///
/// # Errors
///
/// [`OutputError`] naming `dir` and what is wrong: a file where a folder must be, or a folder
/// that takes no new file.
pub fn check_output_dir(dir: &Path) -> Result<(), OutputError> {
    for at in dir.ancestors() {
        // A relative path's last ancestor is empty: the working folder.
        let at = if at.as_os_str().is_empty() {
            Path::new(".")
        } else {
            at
        };
        if at.exists() {
            if !at.is_dir() {
                return Err(OutputError::NotAFolder {
                    path: dir.to_path_buf(),
                    folder: at.to_path_buf(),
                });
            }
            return takes_files(dir, at);
        }
    }
    // Not even the working folder exists (it was removed).
    Err(OutputError::MissingFolder {
        path: dir.to_path_buf(),
        folder: PathBuf::from("."),
    })
}

/// Writes `path` whole or not at all: `write` fills a temporary file in `path`'s folder
/// (buffered), which is flushed, synced to disk and renamed over `path`. If `write` or any
/// step fails, `path` keeps what it held and the temporary file is removed.
///
/// # Errors
///
/// The first I/O error: of `write`, of making the temporary file, of syncing or of the
/// rename.
pub fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    let folder = folder_of(path);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let prefix = format!(".{name}.");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".tmp");
    // A temporary file is private (0600); the output gets the mode a new file gets (0666 less
    // the umask), or the mode of the file it replaces.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    let tmp = builder.tempfile_in(&folder)?;
    #[cfg(unix)]
    if let Ok(old) = std::fs::metadata(path) {
        tmp.as_file().set_permissions(old.permissions())?;
    }
    // Written through the plain file, so that an error is the operating system's alone: the
    // caller names `path`, and the temporary's name (removed on failure) is not in it.
    let mut w = BufWriter::new(tmp.as_file());
    write(&mut w)?;
    w.into_inner().map_err(io::IntoInnerError::into_error)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// [`write_atomically`] of `bytes`.
///
/// # Errors
///
/// As [`write_atomically`].
pub fn write_bytes_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomically(path, |w| w.write_all(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leftovers(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect()
    }

    #[test]
    fn a_failed_write_keeps_the_old_file_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.bin");
        write_bytes_atomically(&path, b"old contents").unwrap();
        let e = write_atomically(&path, |w| {
            w.write_all(b"half of the new")?;
            Err(io::Error::other("disk full"))
        })
        .unwrap_err();
        assert_eq!(e.to_string(), "disk full");
        assert_eq!(std::fs::read(&path).unwrap(), b"old contents");
        assert!(
            leftovers(dir.path()).is_empty(),
            "{:?}",
            leftovers(dir.path())
        );
        write_bytes_atomically(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        assert!(leftovers(dir.path()).is_empty());
    }

    #[cfg(unix)]
    #[test]
    fn outputs_get_a_new_files_mode_or_the_replaced_files() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.bin");
        write_bytes_atomically(&path, b"a").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        // Readable by others unless the umask says otherwise: never the temporary's 0600
        // when the umask allows more.
        let reference = dir.path().join("reference");
        std::fs::write(&reference, b"r").unwrap();
        assert_eq!(mode(&path), mode(&reference));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        write_bytes_atomically(&path, b"b").unwrap();
        assert_eq!(mode(&path), 0o640);
    }

    #[test]
    fn output_paths_are_checked_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a_file");
        std::fs::write(&file, b"x").unwrap();
        // A file into a missing folder, into a file, and a file named as a folder.
        let e = check_output_file(&dir.path().join("missing/w.safetensors")).unwrap_err();
        assert!(
            matches!(e, OutputError::MissingFolder { .. }) && e.to_string().contains("missing"),
            "{e}"
        );
        let e = check_output_file(&file.join("w.safetensors")).unwrap_err();
        assert!(matches!(e, OutputError::NotAFolder { .. }), "{e}");
        let e = check_output_file(dir.path()).unwrap_err();
        assert!(matches!(e, OutputError::IsAFolder { .. }), "{e}");
        check_output_file(&dir.path().join("w.safetensors")).unwrap();
        // A report folder: a file is refused, a new folder under a file too, a new nested
        // folder under a folder is fine.
        let e = check_output_dir(&file).unwrap_err();
        assert!(matches!(e, OutputError::NotAFolder { .. }), "{e}");
        let e = check_output_dir(&file.join("report")).unwrap_err();
        assert!(e.to_string().contains("a_file"), "{e}");
        check_output_dir(&dir.path().join("new/nested")).unwrap();
        check_output_dir(dir.path()).unwrap();
        assert!(leftovers(dir.path()).is_empty());
        assert!(!dir.path().join("new").exists(), "a check makes nothing");
    }
}
