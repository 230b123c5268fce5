//! External data: tensors whose bytes live in a file beside the model.
//!
//! Large exports (anything over protobuf's 2 GB limit, and what `onnx.save_model(...,
//! save_as_external_data=True)` or `torch.onnx.export` write for big models) keep each
//! tensor's bytes in another file, named by the tensor's `external_data` entries: `location`
//! (a path relative to the model's folder), `offset` and `length` in bytes (both optional:
//! from the start, to the end of the file). Reading a model, the bytes of every such tensor
//! whose file is there are read into the tensor (`raw_data`), as onnx's
//! `load_external_data_for_model` does; a file that is not there, or is empty, leaves the
//! tensor without values, which estimates do not need (weight-free, "stripped" exports).
//!
//! As onnx.checker does, a location must stay inside the model's folder: an absolute path,
//! or one that leaves the folder through `..` or a symbolic link, is refused.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};

use super::proto::{GraphProto, TensorProto};
use super::OnnxError;

/// `TensorProto.DataLocation.EXTERNAL`.
const EXTERNAL: i32 = 1;

/// One tensor's external-data entries.
struct Entry {
    location: String,
    offset: u64,
    length: Option<u64>,
}

/// Reads the external entries of `t` (`None` when its data is in the model).
fn entry(t: &TensorProto) -> Result<Option<Entry>, OnnxError> {
    if t.data_location != Some(EXTERNAL) && t.external_data.is_empty() {
        return Ok(None);
    }
    let tensor = t.name.clone().unwrap_or_default();
    let mut location = None;
    let mut offset = 0;
    let mut length = None;
    for e in &t.external_data {
        let value = e.value.clone().unwrap_or_default();
        let number = |key: &str| {
            value
                .trim()
                .parse::<u64>()
                .map_err(|_| OnnxError::ExternalData {
                    tensor: tensor.clone(),
                    location: location.clone().unwrap_or_default(),
                    message: format!("its `{key}` entry `{value}` is not a byte count"),
                })
        };
        match e.key.as_deref() {
            Some("location") => location = Some(value.clone()),
            Some("offset") => offset = number("offset")?,
            Some("length") => length = Some(number("length")?),
            // `checksum` and unknown keys are informational.
            _ => {}
        }
    }
    let location = location.ok_or_else(|| OnnxError::ExternalData {
        tensor: tensor.clone(),
        location: String::new(),
        message: "its data is marked external but no `location` is given".into(),
    })?;
    Ok(Some(Entry {
        location,
        offset,
        length,
    }))
}

/// The file `location` names inside `folder`, or why it may not be read.
fn resolve(folder: &Path, location: &str) -> Result<PathBuf, String> {
    let rel = Path::new(location);
    if location.is_empty() {
        return Err("the location is empty".into());
    }
    if rel.is_absolute() || rel.has_root() {
        return Err(
            "the location is an absolute path; it must be relative to the model's folder".into(),
        );
    }
    if rel
        .components()
        .any(|c| matches!(c, Component::ParentDir | Component::Prefix(_)))
    {
        return Err("the location leaves the model's folder (`..`)".into());
    }
    Ok(folder.join(rel))
}

/// Reads the bytes of every external tensor of `graph` (initializers, node attributes and
/// subgraphs) whose file is there into the tensor, relative to `folder`.
///
/// # Errors
///
/// [`OnnxError::ExternalData`] naming the tensor and its location: a location outside the
/// folder, a file that cannot be read, a range beyond the file's end, bad entries.
pub(crate) fn load(graph: &mut GraphProto, folder: &Path) -> Result<(), OnnxError> {
    let mut files = Files {
        folder: folder.to_path_buf(),
        canonical_folder: None,
        open: HashMap::new(),
    };
    load_graph(graph, &mut files)
}

struct Files {
    folder: PathBuf,
    canonical_folder: Option<PathBuf>,
    /// Open files by location, with their lengths; `None`: not there.
    open: HashMap<String, Option<(File, u64)>>,
}

fn load_graph(graph: &mut GraphProto, files: &mut Files) -> Result<(), OnnxError> {
    for t in &mut graph.initializer {
        load_tensor(t, files)?;
    }
    for node in &mut graph.node {
        for a in &mut node.attribute {
            if let Some(t) = &mut a.t {
                load_tensor(t, files)?;
            }
            for t in &mut a.tensors {
                load_tensor(t, files)?;
            }
            if let Some(g) = &mut a.g {
                load_graph(g, files)?;
            }
            for g in &mut a.graphs {
                load_graph(g, files)?;
            }
        }
    }
    Ok(())
}

fn load_tensor(t: &mut TensorProto, files: &mut Files) -> Result<(), OnnxError> {
    let Some(e) = entry(t)? else {
        return Ok(());
    };
    let tensor = t.name.clone().unwrap_or_default();
    let fail = |message: String| OnnxError::ExternalData {
        tensor: tensor.clone(),
        location: e.location.clone(),
        message,
    };
    if !files.open.contains_key(&e.location) {
        let path = resolve(&files.folder, &e.location).map_err(&fail)?;
        let opened = match File::open(&path) {
            Ok(f) => {
                // A symbolic link (or a link in the path) may still point outside.
                let canonical = path.canonicalize().map_err(|err| fail(err.to_string()))?;
                if files.canonical_folder.is_none() {
                    files.canonical_folder = Some(
                        files
                            .folder
                            .canonicalize()
                            .map_err(|err| fail(err.to_string()))?,
                    );
                }
                if let Some(folder) = &files.canonical_folder {
                    if !canonical.starts_with(folder) {
                        return Err(fail(format!(
                            "the location resolves to {}, outside the model's folder",
                            canonical.display()
                        )));
                    }
                }
                let len = f
                    .metadata()
                    .map_err(|err| fail(format!("{}: {err}", path.display())))?
                    .len();
                Some((f, len))
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
            Err(err) => return Err(fail(format!("{}: {err}", path.display()))),
        };
        files.open.insert(e.location.clone(), opened);
    }
    let Some(Some((file, file_len))) = files.open.get_mut(&e.location) else {
        // Not there: the tensor stays without values (a weight-free model).
        return Ok(());
    };
    let file_len = *file_len;
    if file_len == 0 {
        // An empty file stands for stripped weights as an absent one does (the shipped
        // weight-free files keep an empty `__stripped__` beside them, so that `onnx.load`
        // reads them): the tensor stays without values.
        return Ok(());
    }
    let length = e.length.unwrap_or(file_len.saturating_sub(e.offset));
    let end = e.offset.saturating_add(length);
    if end > file_len {
        return Err(fail(format!(
            "bytes {}..{end} are beyond the file's end ({file_len} bytes)",
            e.offset
        )));
    }
    let len = usize::try_from(length).map_err(|_| fail(format!("{length} bytes is too large")))?;
    let mut bytes = vec![0u8; len];
    file.seek(SeekFrom::Start(e.offset))
        .and_then(|_| file.read_exact(&mut bytes))
        .map_err(|err| fail(format!("reading bytes {}..{end}: {err}", e.offset)))?;
    t.raw_data = Some(bytes);
    t.external_data.clear();
    t.data_location = None;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::proto::StringStringEntryProto;
    use super::*;

    fn external(name: &str, entries: &[(&str, &str)]) -> TensorProto {
        TensorProto {
            name: Some(name.into()),
            data_location: Some(EXTERNAL),
            external_data: entries
                .iter()
                .map(|(k, v)| StringStringEntryProto {
                    key: Some((*k).into()),
                    value: Some((*v).into()),
                })
                .collect(),
            ..TensorProto::default()
        }
    }

    fn graph(tensors: Vec<TensorProto>) -> GraphProto {
        GraphProto {
            initializer: tensors,
            ..GraphProto::default()
        }
    }

    #[test]
    fn ranges_are_read_and_bad_locations_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("w.data"), b"0123456789").unwrap();
        let mut g = graph(vec![
            external(
                "a",
                &[("location", "w.data"), ("offset", "2"), ("length", "3")],
            ),
            external("b", &[("location", "w.data"), ("offset", "8")]),
            external("c", &[("location", "absent.data")]),
            external("d", &[("location", "empty.data"), ("length", "12")]),
        ]);
        std::fs::write(dir.path().join("empty.data"), b"").unwrap();
        load(&mut g, dir.path()).unwrap();
        assert_eq!(g.initializer[0].raw_data.as_deref(), Some(&b"234"[..]));
        assert_eq!(g.initializer[0].data_location, None);
        assert_eq!(g.initializer[1].raw_data.as_deref(), Some(&b"89"[..]));
        // An absent file leaves the tensor external (weight-free).
        assert_eq!(g.initializer[2].data_location, Some(EXTERNAL));
        // So does an empty one (the shipped files' `__stripped__`), whatever its range.
        assert_eq!(g.initializer[3].data_location, Some(EXTERNAL));
        assert_eq!(g.initializer[3].raw_data, None);

        let refused = |entries: &[(&str, &str)], needle: &str| {
            let mut g = graph(vec![external("w", entries)]);
            let e = load(&mut g, dir.path()).unwrap_err().to_string();
            assert!(e.contains("`w`") && e.contains(needle), "{e}");
        };
        refused(
            &[("location", "w.data"), ("offset", "8"), ("length", "3")],
            "beyond",
        );
        refused(&[("location", "../w.data")], "leaves the model's folder");
        refused(&[("location", "/etc/passwd")], "absolute");
        refused(
            &[("location", "w.data"), ("offset", "-1")],
            "not a byte count",
        );
        refused(&[("offset", "0")], "no `location`");
        #[cfg(unix)]
        {
            let outside = tempfile::tempdir().unwrap();
            std::fs::write(outside.path().join("x"), b"secret").unwrap();
            std::os::unix::fs::symlink(outside.path().join("x"), dir.path().join("link")).unwrap();
            refused(&[("location", "link")], "outside the model's folder");
        }
    }
}
