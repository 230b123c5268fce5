//! Reader for the IDX file format that MNIST ships in.
//!
//! An IDX file is a big-endian `u32` magic number `0x0000_TTDD`, where `TT` is the element type
//! (`0x08` means `u8`, the only type read here) and `DD` the number of dimensions, followed by
//! `DD` big-endian `u32` dimension sizes and then the elements, row-major. Image files have three
//! dimensions (count, rows, columns); label files have one (count).
//!
//! Files may be stored raw or gzip-compressed. Compression is detected from the gzip magic bytes
//! `1f 8b`, never from the file name, so `parse_images` and `parse_labels` accept either.
//!
//! Parsing never panics: every size is checked against the data actually present before it is
//! used, dimension products are computed with overflow checks, and no buffer is allocated from a
//! size the header merely claims. Every error names the file and, where meaningful, the byte
//! offset in the (decompressed) stream.

use std::fmt;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use flate2::read::MultiGzDecoder;

/// Magic number of an IDX file holding `u8` data in three dimensions (an images file).
pub const IMAGES_MAGIC: u32 = 0x0000_0803;

/// Magic number of an IDX file holding `u8` data in one dimension (a labels file).
pub const LABELS_MAGIC: u32 = 0x0000_0801;

/// The first two bytes of every gzip stream.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// File name of the MNIST training images.
const TRAIN_IMAGES: &str = "train-images-idx3-ubyte";
/// File name of the MNIST training labels.
const TRAIN_LABELS: &str = "train-labels-idx1-ubyte";
/// File name of the MNIST test images.
const TEST_IMAGES: &str = "t10k-images-idx3-ubyte";
/// File name of the MNIST test labels.
const TEST_LABELS: &str = "t10k-labels-idx1-ubyte";

/// A set of equally sized greyscale images read from an IDX images file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Images {
    /// Number of images.
    pub count: usize,
    /// Height of each image in pixels.
    pub rows: usize,
    /// Width of each image in pixels.
    pub cols: usize,
    /// All pixels, row-major, image after image; `pixels.len() == count * rows * cols`.
    pub pixels: Vec<u8>,
}

impl Images {
    /// Number of pixels in one image (`rows * cols`).
    #[must_use]
    pub fn pixels_per_image(&self) -> usize {
        self.rows * self.cols
    }

    /// The pixels of image `i`, row-major.
    ///
    /// # Panics
    ///
    /// Panics if `i >= self.count`.
    #[must_use]
    pub fn image(&self, i: usize) -> &[u8] {
        assert!(
            i < self.count,
            "image index {i} out of range for {} images",
            self.count
        );
        let n = self.pixels_per_image();
        &self.pixels[i * n..(i + 1) * n]
    }
}

/// The labels read from an IDX labels file, one per image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Labels {
    /// One label per image, in file order.
    pub labels: Vec<u8>,
}

/// The four MNIST files: training and test images with their labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mnist {
    /// Training images (`train-images-idx3-ubyte`).
    pub train_images: Images,
    /// Training labels (`train-labels-idx1-ubyte`), one per training image.
    pub train_labels: Labels,
    /// Test images (`t10k-images-idx3-ubyte`).
    pub test_images: Images,
    /// Test labels (`t10k-labels-idx1-ubyte`), one per test image.
    pub test_labels: Labels,
}

/// The part of an IDX stream that a [`IdxError::Truncated`] error found too short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Section {
    /// The four-byte magic number at offset 0.
    Magic,
    /// The dimension sizes that follow the magic number.
    Dims,
    /// The pixel data of an images file.
    Pixels,
    /// The label data of a labels file.
    Labels,
}

impl fmt::Display for Section {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Section::Magic => "magic number",
            Section::Dims => "dimension sizes",
            Section::Pixels => "pixels",
            Section::Labels => "labels",
        })
    }
}

/// Everything that can go wrong reading an IDX file.
///
/// Every variant names the file it is about (`path` is the `source` string given to
/// [`parse_images`] / [`parse_labels`], or the path given to the `read_*` functions). Offsets are
/// byte offsets in the decompressed stream.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdxError {
    /// The file could not be read (missing, unreadable, ...).
    #[error("{path}: cannot read file: {source}")]
    Io {
        /// The file that could not be read.
        path: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The file starts with the gzip magic bytes but is not a valid gzip stream (corrupt,
    /// truncated, bad checksum, or trailing garbage after the last member).
    #[error("{path}: corrupt gzip stream: {source}")]
    Gzip {
        /// The file being decompressed.
        path: String,
        /// The decompression error.
        #[source]
        source: io::Error,
    },
    /// The stream ends before a section is complete: the header itself, or less data than the
    /// dimensions in the header say.
    #[error(
        "{path}: truncated at byte {offset}: {} {needed} bytes of {section}, found {available}",
        truncation_verb(*.section)
    )]
    Truncated {
        /// The file being parsed.
        path: String,
        /// The section that is too short.
        section: Section,
        /// Byte offset at which the short section starts.
        offset: u64,
        /// Bytes the section needs.
        needed: u64,
        /// Bytes actually present for the section.
        available: u64,
    },
    /// The magic number is not the expected one: not an IDX file, a data type other than `u8`,
    /// or the wrong number of dimensions (for example a labels file given as images).
    #[error(
        "{path}: bad magic number 0x{found:08x} ({}), expected 0x{expected:08x} ({})",
        describe_magic(*.found),
        describe_magic(*.expected)
    )]
    BadMagic {
        /// The file being parsed.
        path: String,
        /// The magic number found at offset 0.
        found: u32,
        /// The magic number expected.
        expected: u32,
    },
    /// The product of the dimensions in the header does not fit in memory sizes (`usize`/`u64`).
    #[error("{path}: header dimensions {} are too large to address", join_dims(.dims))]
    TooLarge {
        /// The file being parsed.
        path: String,
        /// The dimension sizes from the header.
        dims: Vec<u32>,
    },
    /// There are bytes after the data that the header describes.
    #[error(
        "{path}: {extra} unexpected bytes at byte {offset}, after the data the header describes"
    )]
    TrailingBytes {
        /// The file being parsed.
        path: String,
        /// Byte offset at which the unexpected bytes start (the end of the described data).
        offset: u64,
        /// Number of unexpected bytes.
        extra: u64,
    },
    /// An images file and its labels file disagree on the number of items.
    #[error("{images_path} has {images} images but {labels_path} has {labels} labels")]
    CountMismatch {
        /// The images file.
        images_path: String,
        /// Number of images in it.
        images: usize,
        /// The labels file.
        labels_path: String,
        /// Number of labels in it.
        labels: usize,
    },
    /// [`load_mnist`] found neither the raw nor the gzipped version of one of the four files.
    #[error("{dir}: MNIST file {name} not found (looked for {name} and {name}.gz)")]
    MissingFile {
        /// The directory searched.
        dir: String,
        /// The file name looked for (without `.gz`; both it and `<name>.gz` were tried).
        name: String,
    },
}

/// How a truncation message introduces the bytes a section needs: a header section has a fixed
/// size, a data section the size the header claims.
fn truncation_verb(section: Section) -> &'static str {
    match section {
        Section::Magic | Section::Dims => "needed",
        Section::Pixels | Section::Labels => "header says",
    }
}

/// Dimension sizes as `AxBxC`, for error messages.
fn join_dims(dims: &[u32]) -> String {
    let dims: Vec<String> = dims.iter().map(u32::to_string).collect();
    dims.join("x")
}

/// Human-readable description of an IDX magic number, for error messages.
fn describe_magic(magic: u32) -> String {
    if magic >> 16 != 0 {
        return "not an IDX file".to_owned();
    }
    let ty = (magic >> 8) & 0xff;
    let dims = magic & 0xff;
    let ty = match ty {
        0x08 => "u8".to_owned(),
        0x09 => "i8".to_owned(),
        0x0b => "i16".to_owned(),
        0x0c => "i32".to_owned(),
        0x0d => "f32".to_owned(),
        0x0e => "f64".to_owned(),
        other => format!("unknown type 0x{other:02x}"),
    };
    let plural = if dims == 1 { "" } else { "s" };
    format!("{ty}, {dims} dimension{plural}")
}

/// Reads into `buf` until it is full or the stream ends; returns the number of bytes read.
fn read_full<R: Read>(reader: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Header dimensions and data of a parsed IDX stream.
struct Parsed {
    dims: Vec<usize>,
    data: Vec<u8>,
}

/// Parses a raw or gzipped `u8` IDX stream with `ndims` dimensions.
fn parse_u8(bytes: &[u8], source: &str, ndims: u8, data: Section) -> Result<Parsed, IdxError> {
    if bytes.starts_with(&GZIP_MAGIC) {
        parse_stream(MultiGzDecoder::new(bytes), source, ndims, data, true)
    } else {
        parse_stream(bytes, source, ndims, data, false)
    }
}

/// Parses a decompressed `u8` IDX stream with `ndims` dimensions from `reader`.
fn parse_stream<R: Read>(
    mut reader: R,
    source: &str,
    ndims: u8,
    data_section: Section,
    gzipped: bool,
) -> Result<Parsed, IdxError> {
    let read_error = |e: io::Error| {
        if gzipped {
            IdxError::Gzip {
                path: source.to_owned(),
                source: e,
            }
        } else {
            IdxError::Io {
                path: source.to_owned(),
                source: e,
            }
        }
    };
    let truncated = |section, offset: usize, needed: u64, available: usize| IdxError::Truncated {
        path: source.to_owned(),
        section,
        offset: offset as u64,
        needed,
        available: available as u64,
    };

    let mut magic = [0u8; 4];
    let got = read_full(&mut reader, &mut magic).map_err(read_error)?;
    if got < magic.len() {
        return Err(truncated(Section::Magic, 0, 4, got));
    }
    let found = u32::from_be_bytes(magic);
    let expected = 0x0800 | u32::from(ndims);
    if found != expected {
        return Err(IdxError::BadMagic {
            path: source.to_owned(),
            found,
            expected,
        });
    }

    let header_len = 4 + 4 * usize::from(ndims);
    let mut dim_bytes = vec![0u8; 4 * usize::from(ndims)];
    let got = read_full(&mut reader, &mut dim_bytes).map_err(read_error)?;
    if got < dim_bytes.len() {
        return Err(truncated(Section::Dims, 4, dim_bytes.len() as u64, got));
    }
    let raw_dims: Vec<u32> = dim_bytes
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
        .collect();

    // Multiply from the innermost dimension out, so that every trailing product (for example
    // `rows * cols` of an images file, even with a count of zero) is known to fit as well.
    let too_large = || IdxError::TooLarge {
        path: source.to_owned(),
        dims: raw_dims.clone(),
    };
    let mut dims = Vec::with_capacity(raw_dims.len());
    let mut len: usize = 1;
    for &d in raw_dims.iter().rev() {
        let d = usize::try_from(d).map_err(|_| too_large())?;
        len = len.checked_mul(d).ok_or_else(too_large)?;
        dims.push(d);
    }
    dims.reverse();
    let needed = u64::try_from(len).map_err(|_| too_large())?;

    // `read_to_end` grows the buffer as data arrives, so a header claiming a huge size costs
    // nothing unless the data is really there.
    let mut data = Vec::new();
    let got = reader
        .by_ref()
        .take(needed)
        .read_to_end(&mut data)
        .map_err(read_error)?;
    if got < len {
        return Err(truncated(data_section, header_len, needed, got));
    }

    let extra = io::copy(&mut reader, &mut io::sink()).map_err(read_error)?;
    if extra > 0 {
        return Err(IdxError::TrailingBytes {
            path: source.to_owned(),
            offset: header_len as u64 + needed,
            extra,
        });
    }
    Ok(Parsed { dims, data })
}

/// Parses an IDX images file (magic `0x00000803`: `u8` pixels, dimensions count x rows x cols).
///
/// `bytes` may be raw or gzip-compressed (detected from the gzip magic bytes). `source` names the
/// file in errors.
///
/// # Errors
///
/// [`IdxError::Gzip`] for a corrupt gzip stream, [`IdxError::BadMagic`] if this is not a `u8`
/// IDX file with three dimensions, [`IdxError::Truncated`] if the header or data is short,
/// [`IdxError::TooLarge`] if the dimensions overflow, and [`IdxError::TrailingBytes`] if there is
/// data after the pixels.
pub fn parse_images(bytes: &[u8], source: &str) -> Result<Images, IdxError> {
    let Parsed { dims, data } = parse_u8(bytes, source, 3, Section::Pixels)?;
    Ok(Images {
        count: dims[0],
        rows: dims[1],
        cols: dims[2],
        pixels: data,
    })
}

/// Parses an IDX labels file (magic `0x00000801`: one `u8` label per item).
///
/// `bytes` may be raw or gzip-compressed (detected from the gzip magic bytes). `source` names the
/// file in errors.
///
/// # Errors
///
/// [`IdxError::Gzip`] for a corrupt gzip stream, [`IdxError::BadMagic`] if this is not a `u8`
/// IDX file with one dimension, [`IdxError::Truncated`] if the header or data is short,
/// [`IdxError::TooLarge`] if the dimensions overflow, and [`IdxError::TrailingBytes`] if there is
/// data after the labels.
pub fn parse_labels(bytes: &[u8], source: &str) -> Result<Labels, IdxError> {
    let Parsed { data, .. } = parse_u8(bytes, source, 1, Section::Labels)?;
    Ok(Labels { labels: data })
}

/// Reads a whole file, naming it in the error.
fn read_file(path: &Path) -> Result<Vec<u8>, IdxError> {
    std::fs::read(path).map_err(|source| IdxError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// Reads an IDX images file, raw or gzip-compressed.
///
/// # Errors
///
/// [`IdxError::Io`] if the file cannot be read, otherwise as [`parse_images`].
pub fn read_images(path: &Path) -> Result<Images, IdxError> {
    parse_images(&read_file(path)?, &path.display().to_string())
}

/// Reads an IDX labels file, raw or gzip-compressed.
///
/// # Errors
///
/// [`IdxError::Io`] if the file cannot be read, otherwise as [`parse_labels`].
pub fn read_labels(path: &Path) -> Result<Labels, IdxError> {
    parse_labels(&read_file(path)?, &path.display().to_string())
}

/// Finds `dir/name`, or else `dir/name.gz`.
fn find_file(dir: &Path, name: &str) -> Result<PathBuf, IdxError> {
    let raw = dir.join(name);
    if raw.is_file() {
        return Ok(raw);
    }
    let gz = dir.join(format!("{name}.gz"));
    if gz.is_file() {
        return Ok(gz);
    }
    Err(IdxError::MissingFile {
        dir: dir.display().to_string(),
        name: name.to_owned(),
    })
}

/// Reads one split (images and labels) and checks that the counts agree.
fn load_split(dir: &Path, images: &str, labels: &str) -> Result<(Images, Labels), IdxError> {
    let images_path = find_file(dir, images)?;
    let labels_path = find_file(dir, labels)?;
    let images = read_images(&images_path)?;
    let labels = read_labels(&labels_path)?;
    if images.count != labels.labels.len() {
        return Err(IdxError::CountMismatch {
            images_path: images_path.display().to_string(),
            images: images.count,
            labels_path: labels_path.display().to_string(),
            labels: labels.labels.len(),
        });
    }
    Ok((images, labels))
}

/// Loads `train-images-idx3-ubyte[.gz]`, `train-labels-idx1-ubyte[.gz]`,
/// `t10k-images-idx3-ubyte[.gz]` and `t10k-labels-idx1-ubyte[.gz]` from `dir` (preferring the raw
/// name if present, else `.gz`), and checks that image and label counts agree per split.
///
/// # Errors
///
/// [`IdxError::MissingFile`] if neither `<name>` nor `<name>.gz` exists for one of the four
/// files, [`IdxError::CountMismatch`] if a split has different numbers of images and labels, and
/// any error of [`read_images`] / [`read_labels`].
pub fn load_mnist(dir: &Path) -> Result<Mnist, IdxError> {
    let (train_images, train_labels) = load_split(dir, TRAIN_IMAGES, TRAIN_LABELS)?;
    let (test_images, test_labels) = load_split(dir, TEST_IMAGES, TEST_LABELS)?;
    Ok(Mnist {
        train_images,
        train_labels,
        test_images,
        test_labels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;
    use std::io::Write;

    /// Builds an IDX buffer from a magic number, dimensions and data.
    fn idx(magic: u32, dims: &[u32], data: &[u8]) -> Vec<u8> {
        let mut out = magic.to_be_bytes().to_vec();
        for d in dims {
            out.extend_from_slice(&d.to_be_bytes());
        }
        out.extend_from_slice(data);
        out
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(bytes).unwrap();
        enc.finish().unwrap()
    }

    /// Two 2x3 images.
    fn sample_images() -> Vec<u8> {
        idx(
            IMAGES_MAGIC,
            &[2, 2, 3],
            &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
        )
    }

    fn sample_labels() -> Vec<u8> {
        idx(LABELS_MAGIC, &[3], &[7, 0, 9])
    }

    /// A fresh, empty directory under the system temp dir; removed by the returned guard.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir()
                .join(format!("tessera-idx-test-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }

        fn write(&self, name: &str, bytes: &[u8]) {
            std::fs::write(self.0.join(name), bytes).unwrap();
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn assert_one_line(e: &IdxError) {
        let s = e.to_string();
        assert!(!s.contains('\n'), "multi-line message: {s}");
    }

    #[test]
    fn parses_raw_images() {
        let images = parse_images(&sample_images(), "mem").unwrap();
        assert_eq!((images.count, images.rows, images.cols), (2, 2, 3));
        assert_eq!(images.pixels_per_image(), 6);
        assert_eq!(images.image(0), &[0, 1, 2, 3, 4, 5]);
        assert_eq!(images.image(1), &[6, 7, 8, 9, 10, 11]);
        assert_eq!(images.pixels.len(), 12);
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn image_index_out_of_range_panics() {
        let images = parse_images(&sample_images(), "mem").unwrap();
        let _ = images.image(2);
    }

    #[test]
    fn parses_gzipped_same_as_raw() {
        let raw = sample_images();
        assert_eq!(
            parse_images(&gzip(&raw), "mem").unwrap(),
            parse_images(&raw, "mem").unwrap()
        );
        let raw = sample_labels();
        assert_eq!(
            parse_labels(&gzip(&raw), "mem").unwrap(),
            parse_labels(&raw, "mem").unwrap()
        );
    }

    #[test]
    fn parses_multi_member_gzip() {
        let raw = sample_images();
        let (a, b) = raw.split_at(7);
        let mut gz = gzip(a);
        gz.extend_from_slice(&gzip(b));
        assert_eq!(
            parse_images(&gz, "mem").unwrap(),
            parse_images(&raw, "mem").unwrap()
        );
    }

    #[test]
    fn parses_labels() {
        let labels = parse_labels(&sample_labels(), "mem").unwrap();
        assert_eq!(labels.labels, vec![7, 0, 9]);
    }

    #[test]
    fn parses_empty_sets() {
        let images = parse_images(&idx(IMAGES_MAGIC, &[0, 28, 28], &[]), "mem").unwrap();
        assert_eq!((images.count, images.rows, images.cols), (0, 28, 28));
        assert!(images.pixels.is_empty());
        let labels = parse_labels(&idx(LABELS_MAGIC, &[0], &[]), "mem").unwrap();
        assert!(labels.labels.is_empty());
    }

    #[test]
    fn zero_count_with_huge_image_size_is_fine() {
        let images = parse_images(&idx(IMAGES_MAGIC, &[0, 65_536, 65_535], &[]), "mem").unwrap();
        assert_eq!(images.count, 0);
        assert_eq!(images.pixels_per_image(), 65_536 * 65_535);
    }

    #[test]
    fn empty_input_is_truncated_magic() {
        for bytes in [&[][..], &[0, 0][..], &[0, 0, 8][..]] {
            match parse_images(bytes, "mem").unwrap_err() {
                IdxError::Truncated {
                    section: Section::Magic,
                    offset: 0,
                    needed: 4,
                    available,
                    ..
                } => assert_eq!(available, bytes.len() as u64),
                e => panic!("unexpected {e:?}"),
            }
        }
        let e = parse_labels(&[0, 0], "x.idx").unwrap_err();
        assert_eq!(
            e.to_string(),
            "x.idx: truncated at byte 0: needed 4 bytes of magic number, found 2"
        );
    }

    #[test]
    fn truncated_dims() {
        let bytes = &sample_images()[..9];
        let e = parse_images(bytes, "mem").unwrap_err();
        assert!(matches!(
            e,
            IdxError::Truncated {
                section: Section::Dims,
                offset: 4,
                needed: 12,
                available: 5,
                ..
            }
        ));
        assert_eq!(
            e.to_string(),
            "mem: truncated at byte 4: needed 12 bytes of dimension sizes, found 5"
        );
        // Same through gzip: the decompressed stream is what counts.
        let e = parse_images(&gzip(bytes), "mem").unwrap_err();
        assert!(matches!(
            e,
            IdxError::Truncated {
                section: Section::Dims,
                available: 5,
                ..
            }
        ));
    }

    #[test]
    fn truncated_pixels_message() {
        let bytes = gzip(&idx(IMAGES_MAGIC, &[60_000, 28, 28], &[0; 1000]));
        let e = parse_images(&bytes, "data/train-images-idx3-ubyte.gz").unwrap_err();
        assert!(matches!(
            e,
            IdxError::Truncated {
                section: Section::Pixels,
                offset: 16,
                needed: 47_040_000,
                available: 1000,
                ..
            }
        ));
        assert_eq!(
            e.to_string(),
            "data/train-images-idx3-ubyte.gz: truncated at byte 16: header says 47040000 bytes \
             of pixels, found 1000"
        );
        assert!(e.source().is_none());
        assert_one_line(&e);
    }

    #[test]
    fn truncated_labels() {
        let bytes = idx(LABELS_MAGIC, &[5], &[1, 2]);
        let e = parse_labels(&bytes, "labels").unwrap_err();
        assert!(matches!(
            e,
            IdxError::Truncated {
                section: Section::Labels,
                offset: 8,
                needed: 5,
                available: 2,
                ..
            }
        ));
        assert_eq!(
            e.to_string(),
            "labels: truncated at byte 8: header says 5 bytes of labels, found 2"
        );
    }

    #[test]
    fn huge_claimed_size_does_not_allocate() {
        // 4294967295 x 4294967295 x 1 fits in u64 but is nowhere near present.
        let bytes = idx(IMAGES_MAGIC, &[u32::MAX, u32::MAX, 1], &[1, 2, 3]);
        let e = parse_images(&bytes, "mem").unwrap_err();
        if cfg!(target_pointer_width = "64") {
            let needed = u64::from(u32::MAX) * u64::from(u32::MAX);
            assert!(
                matches!(
                    e,
                    IdxError::Truncated {
                        section: Section::Pixels,
                        offset: 16,
                        needed: n,
                        available: 3,
                        ..
                    } if n == needed
                ),
                "{e:?}"
            );
        } else {
            assert!(matches!(e, IdxError::TooLarge { .. }), "{e:?}");
        }
    }

    #[test]
    fn dimension_overflow_is_too_large() {
        let bytes = idx(IMAGES_MAGIC, &[u32::MAX, u32::MAX, u32::MAX], &[]);
        let e = parse_images(&bytes, "mem").unwrap_err();
        match &e {
            IdxError::TooLarge { dims, path } => {
                assert_eq!(dims, &[u32::MAX; 3]);
                assert_eq!(path, "mem");
            }
            e => panic!("unexpected {e:?}"),
        }
        assert_eq!(
            e.to_string(),
            "mem: header dimensions 4294967295x4294967295x4294967295 are too large to address"
        );
    }

    #[test]
    fn bad_magic_labels_as_images() {
        let e = parse_images(&sample_labels(), "labels.idx").unwrap_err();
        assert!(matches!(
            e,
            IdxError::BadMagic {
                found: LABELS_MAGIC,
                expected: IMAGES_MAGIC,
                ..
            }
        ));
        assert_eq!(
            e.to_string(),
            "labels.idx: bad magic number 0x00000801 (u8, 1 dimension), expected 0x00000803 \
             (u8, 3 dimensions)"
        );
        let e = parse_labels(&gzip(&sample_images()), "images.gz").unwrap_err();
        assert!(matches!(
            e,
            IdxError::BadMagic {
                found: IMAGES_MAGIC,
                expected: LABELS_MAGIC,
                ..
            }
        ));
    }

    #[test]
    fn bad_magic_wrong_type_and_not_idx() {
        let e = parse_images(&idx(0x0d03, &[1, 1, 1], &[0; 4]), "f32").unwrap_err();
        assert!(matches!(e, IdxError::BadMagic { found: 0x0d03, .. }));
        assert!(e.to_string().contains("(f32, 3 dimensions)"), "{e}");

        let e = parse_images(b"\x89PNG\r\n\x1a\n", "png").unwrap_err();
        assert!(matches!(
            e,
            IdxError::BadMagic {
                found: 0x8950_4e47,
                ..
            }
        ));
        assert!(e.to_string().contains("not an IDX file"), "{e}");

        let e = parse_labels(&idx(0x4201, &[0], &[]), "odd").unwrap_err();
        assert!(e.to_string().contains("unknown type 0x42"), "{e}");
        assert_one_line(&e);
    }

    #[test]
    fn trailing_bytes() {
        let mut raw = sample_labels();
        raw.extend_from_slice(&[1, 2, 3, 4]);
        for bytes in [raw.clone(), gzip(&raw)] {
            let e = parse_labels(&bytes, "mem").unwrap_err();
            assert!(matches!(
                e,
                IdxError::TrailingBytes {
                    offset: 11,
                    extra: 4,
                    ..
                }
            ));
            assert_eq!(
                e.to_string(),
                "mem: 4 unexpected bytes at byte 11, after the data the header describes"
            );
        }
    }

    #[test]
    fn truncated_gzip_stream() {
        let gz = gzip(&sample_images());
        let e = parse_images(&gz[..gz.len() - 5], "cut.gz").unwrap_err();
        assert!(matches!(e, IdxError::Gzip { ref path, .. } if path == "cut.gz"));
        assert!(e.source().is_some());
        assert!(
            e.to_string().starts_with("cut.gz: corrupt gzip stream: "),
            "{e}"
        );
        assert_one_line(&e);
    }

    #[test]
    fn corrupt_gzip_checksum_and_header() {
        let mut gz = gzip(&sample_images());
        // The CRC32 of the uncompressed data is in the 8-byte trailer.
        let n = gz.len();
        gz[n - 8] ^= 0xff;
        let e = parse_images(&gz, "crc.gz").unwrap_err();
        assert!(matches!(e, IdxError::Gzip { .. }), "{e:?}");

        // Gzip magic followed by garbage.
        let e = parse_images(&[0x1f, 0x8b, 0, 0, 0], "junk.gz").unwrap_err();
        assert!(matches!(e, IdxError::Gzip { .. }), "{e:?}");

        // Garbage after a complete gzip member.
        let mut gz = gzip(&sample_images());
        gz.extend_from_slice(b"garbage!");
        let e = parse_images(&gz, "tail.gz").unwrap_err();
        assert!(matches!(e, IdxError::Gzip { .. }), "{e:?}");
    }

    #[test]
    fn read_missing_file_is_io() {
        let path = Path::new("/nonexistent/tessera/train-images-idx3-ubyte");
        let e = read_images(path).unwrap_err();
        match &e {
            IdxError::Io { path, source } => {
                assert_eq!(path, "/nonexistent/tessera/train-images-idx3-ubyte");
                assert_eq!(source.kind(), io::ErrorKind::NotFound);
            }
            e => panic!("unexpected {e:?}"),
        }
        assert!(e.source().is_some());
        assert!(e
            .to_string()
            .starts_with("/nonexistent/tessera/train-images-idx3-ubyte: cannot read file: "));
        assert!(matches!(
            read_labels(path).unwrap_err(),
            IdxError::Io { .. }
        ));
    }

    #[test]
    fn read_file_names_path_in_errors() {
        let dir = TempDir::new("names");
        dir.write("bad", &[0, 0, 8, 3, 0]);
        let e = read_images(&dir.0.join("bad")).unwrap_err();
        match e {
            IdxError::Truncated { path, .. } => {
                assert_eq!(path, dir.0.join("bad").display().to_string());
            }
            e => panic!("unexpected {e:?}"),
        }
    }

    fn write_mnist(dir: &TempDir, train: u32, train_labels: u32, test: u32, test_labels: u32) {
        let images = |n: u32| gzip(&idx(IMAGES_MAGIC, &[n, 2, 2], &vec![255; n as usize * 4]));
        let labels = |n: u32| gzip(&idx(LABELS_MAGIC, &[n], &vec![3; n as usize]));
        dir.write("train-images-idx3-ubyte.gz", &images(train));
        dir.write("train-labels-idx1-ubyte.gz", &labels(train_labels));
        dir.write("t10k-images-idx3-ubyte.gz", &images(test));
        dir.write("t10k-labels-idx1-ubyte.gz", &labels(test_labels));
    }

    #[test]
    fn load_mnist_reads_all_four() {
        let dir = TempDir::new("all4");
        write_mnist(&dir, 5, 5, 3, 3);
        let m = load_mnist(&dir.0).unwrap();
        assert_eq!(m.train_images.count, 5);
        assert_eq!(m.train_labels.labels.len(), 5);
        assert_eq!(m.test_images.count, 3);
        assert_eq!(m.test_labels.labels, vec![3; 3]);
    }

    #[test]
    fn load_mnist_prefers_raw() {
        let dir = TempDir::new("raw");
        write_mnist(&dir, 5, 5, 3, 3);
        dir.write(
            "t10k-images-idx3-ubyte",
            &idx(IMAGES_MAGIC, &[3, 1, 1], &[1, 2, 3]),
        );
        let m = load_mnist(&dir.0).unwrap();
        assert_eq!((m.test_images.rows, m.test_images.cols), (1, 1));
        assert_eq!(m.test_images.pixels, vec![1, 2, 3]);
    }

    #[test]
    fn load_mnist_count_mismatch() {
        let dir = TempDir::new("mismatch");
        write_mnist(&dir, 5, 5, 3, 2);
        let e = load_mnist(&dir.0).unwrap_err();
        match &e {
            IdxError::CountMismatch {
                images_path,
                images: 3,
                labels_path,
                labels: 2,
            } => {
                assert!(images_path.ends_with("t10k-images-idx3-ubyte.gz"));
                assert!(labels_path.ends_with("t10k-labels-idx1-ubyte.gz"));
            }
            e => panic!("unexpected {e:?}"),
        }
        let images_path = dir.0.join("t10k-images-idx3-ubyte.gz");
        let labels_path = dir.0.join("t10k-labels-idx1-ubyte.gz");
        assert_eq!(
            e.to_string(),
            format!(
                "{} has 3 images but {} has 2 labels",
                images_path.display(),
                labels_path.display()
            )
        );
        assert_one_line(&e);
    }

    #[test]
    fn load_mnist_missing_file() {
        let dir = TempDir::new("missing");
        write_mnist(&dir, 1, 1, 1, 1);
        std::fs::remove_file(dir.0.join("train-labels-idx1-ubyte.gz")).unwrap();
        let e = load_mnist(&dir.0).unwrap_err();
        match &e {
            IdxError::MissingFile { dir: d, name } => {
                assert_eq!(d, &dir.0.display().to_string());
                assert_eq!(name, "train-labels-idx1-ubyte");
            }
            e => panic!("unexpected {e:?}"),
        }
        assert!(e.to_string().ends_with(
            ": MNIST file train-labels-idx1-ubyte not found (looked for \
             train-labels-idx1-ubyte and train-labels-idx1-ubyte.gz)"
        ));
        assert_one_line(&e);
    }

    #[test]
    fn load_mnist_propagates_parse_errors() {
        let dir = TempDir::new("corrupt");
        write_mnist(&dir, 2, 2, 2, 2);
        dir.write("train-images-idx3-ubyte.gz", &[0x1f, 0x8b, 1, 2, 3]);
        match load_mnist(&dir.0).unwrap_err() {
            IdxError::Gzip { path, .. } => assert!(path.ends_with("train-images-idx3-ubyte.gz")),
            e => panic!("unexpected {e:?}"),
        }
    }
}
