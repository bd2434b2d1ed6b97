//! Trace storage for `gpucollect serve`: a local directory (default) or any S3-compatible object
//! store. Uploads stream in: every chunk is validated by the trace decoder and written out as
//! it arrives, so memory stays bounded whatever the trace size. A trace becomes visible only
//! when complete: a local upload goes to a temporary file that is fsynced and renamed; an S3
//! upload is a multipart upload that is completed at the end (and aborted on any error).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use analysis_core::decode::{DecodeError, Decoder};
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, WriteMultipart};
use tokio::io::AsyncWriteExt;

use super::ids::TraceId;

/// Where traces live.
#[derive(Clone, Debug)]
pub enum Store {
    /// `<root>/traces/<id>.msgpack`, with uploads staged in `<root>/tmp/`.
    Local { root: PathBuf },
    /// `<prefix>/<id>.msgpack` in an object store.
    Object {
        store: Arc<dyn ObjectStore>,
        prefix: ObjectPath,
        label: String,
    },
}

/// One stored trace, for retention.
#[derive(Clone, Debug)]
pub struct StoredTrace {
    pub id: TraceId,
    pub size_bytes: u64,
    pub modified: SystemTime,
}

/// Why an upload was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error("the upload is larger than this server's limit of {limit_bytes} bytes")]
    TooLarge { limit_bytes: u64 },
    #[error("the upload was refused: {0}")]
    NotATrace(String),
    #[error("the upload was interrupted: {0}")]
    Interrupted(String),
    #[error("the trace could not be stored: {0}")]
    Storage(String),
}

/// What an accepted upload contained.
#[derive(Clone, Debug, serde::Serialize)]
pub struct UploadSummary {
    pub bytes: u64,
    pub records: u64,
    pub warnings: Vec<String>,
}

/// Feeds upload chunks to the decoder, discarding records, to reject anything that is not a
/// trace as early as possible with bounded memory.
struct Validator {
    decoder: Decoder,
    bytes: u64,
    limit_bytes: u64,
}

impl Validator {
    fn new(limit_bytes: u64) -> Self {
        Self {
            decoder: Decoder::new(),
            bytes: 0,
            limit_bytes,
        }
    }

    fn push(&mut self, chunk: &[u8]) -> Result<(), UploadError> {
        self.bytes += chunk.len() as u64;
        if self.bytes > self.limit_bytes {
            return Err(UploadError::TooLarge {
                limit_bytes: self.limit_bytes,
            });
        }
        self.decoder.push(chunk);
        loop {
            match self.decoder.next_record() {
                Ok(Some(_)) => {}
                Ok(None) => return Ok(()),
                Err(e) => return Err(not_a_trace(&e)),
            }
        }
    }

    fn finish(mut self) -> Result<UploadSummary, UploadError> {
        let warnings = self.decoder.finish().map_err(|e| not_a_trace(&e))?;
        if let Some(e) = self.decoder.fatal() {
            return Err(not_a_trace(e));
        }
        Ok(UploadSummary {
            bytes: self.bytes,
            records: self.decoder.records_decoded(),
            warnings: warnings.iter().map(ToString::to_string).collect(),
        })
    }
}

fn not_a_trace(e: &DecodeError) -> UploadError {
    UploadError::NotATrace(e.to_string())
}

fn storage<E: std::fmt::Display>(e: E) -> UploadError {
    UploadError::Storage(e.to_string())
}

impl Store {
    /// A local store; creates its folders and removes uploads a crash left half-written.
    pub async fn local(root: &Path) -> anyhow::Result<Self> {
        use anyhow::Context;
        for sub in ["traces", "tmp"] {
            tokio::fs::create_dir_all(root.join(sub))
                .await
                .with_context(|| {
                    format!(
                        "cannot create the store folder {}",
                        root.join(sub).display()
                    )
                })?;
        }
        let mut tmp = tokio::fs::read_dir(root.join("tmp")).await?;
        while let Some(e) = tmp.next_entry().await? {
            let _ = tokio::fs::remove_file(e.path()).await;
        }
        Ok(Self::Local {
            root: root.to_path_buf(),
        })
    }

    /// An S3-compatible store from `s3://bucket/prefix`. Credentials, region and endpoint come
    /// from the usual AWS environment variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_REGION`, `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP=true` for a plain-HTTP endpoint).
    pub fn s3(url: &str) -> anyhow::Result<Self> {
        use anyhow::Context;
        let rest = url
            .strip_prefix("s3://")
            .context("an object store location must look like s3://bucket/prefix")?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            anyhow::bail!("the store URL {url} names no bucket: use s3://bucket/prefix");
        }
        let mut b = object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket);
        if let Ok(endpoint) = std::env::var("AWS_ENDPOINT_URL") {
            b = b.with_endpoint(endpoint);
        }
        let store = b
            .build()
            .with_context(|| format!("cannot configure the object store {url}"))?;
        Ok(Self::Object {
            store: Arc::new(store),
            prefix: ObjectPath::from(prefix.trim_matches('/')),
            label: url.to_owned(),
        })
    }

    /// Human-readable location, for logs.
    pub fn describe(&self) -> String {
        match self {
            Self::Local { root } => format!("local directory {}", root.display()),
            Self::Object { label, .. } => format!("object store {label}"),
        }
    }

    fn object_path(prefix: &ObjectPath, id: &TraceId) -> ObjectPath {
        prefix.child(format!("{id}.msgpack"))
    }

    /// Streams an upload into the store under `id`. On any error nothing is left behind.
    pub async fn put<S, E>(
        &self,
        id: &TraceId,
        mut body: S,
        limit_bytes: u64,
    ) -> Result<UploadSummary, UploadError>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let mut v = Validator::new(limit_bytes);
        match self {
            Self::Local { root } => {
                let tmp = root.join("tmp").join(format!("{id}.part"));
                let result = async {
                    let mut f = tokio::fs::File::create(&tmp).await.map_err(storage)?;
                    while let Some(chunk) = body.next().await {
                        let chunk = chunk.map_err(|e| UploadError::Interrupted(e.to_string()))?;
                        v.push(&chunk)?;
                        f.write_all(&chunk).await.map_err(storage)?;
                    }
                    let summary = v.finish()?;
                    f.flush().await.map_err(storage)?;
                    f.sync_all().await.map_err(storage)?;
                    drop(f);
                    let dest = root.join("traces").join(format!("{id}.msgpack"));
                    tokio::fs::rename(&tmp, &dest).await.map_err(storage)?;
                    // Make the rename itself durable.
                    let dir = tokio::fs::File::open(root.join("traces"))
                        .await
                        .map_err(storage)?;
                    dir.sync_all().await.map_err(storage)?;
                    Ok(summary)
                }
                .await;
                if result.is_err() {
                    let _ = tokio::fs::remove_file(&tmp).await;
                }
                result
            }
            Self::Object { store, prefix, .. } => {
                let path = Self::object_path(prefix, id);
                let upload = store.put_multipart(&path).await.map_err(storage)?;
                let mut w = WriteMultipart::new(upload);
                let result = async {
                    while let Some(chunk) = body.next().await {
                        let chunk = chunk.map_err(|e| UploadError::Interrupted(e.to_string()))?;
                        v.push(&chunk)?;
                        w.wait_for_capacity(4).await.map_err(storage)?;
                        w.write(&chunk);
                    }
                    v.finish()
                }
                .await;
                match result {
                    Ok(summary) => {
                        w.finish().await.map_err(storage)?;
                        Ok(summary)
                    }
                    Err(e) => {
                        let _ = w.abort().await;
                        Err(e)
                    }
                }
            }
        }
    }

    /// Opens a stored trace as a byte stream, with its size. `None` when it does not exist.
    pub async fn get(
        &self,
        id: &TraceId,
    ) -> anyhow::Result<
        Option<(
            u64,
            std::pin::Pin<Box<dyn Stream<Item = std::io::Result<Bytes>> + Send>>,
        )>,
    > {
        match self {
            Self::Local { root } => {
                let path = root.join("traces").join(format!("{id}.msgpack"));
                let f = match tokio::fs::File::open(&path).await {
                    Ok(f) => f,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                    Err(e) => return Err(e.into()),
                };
                let len = f.metadata().await?.len();
                let stream = futures_util::stream::unfold(f, |mut f| async move {
                    use tokio::io::AsyncReadExt;
                    let mut buf = vec![0u8; 256 * 1024];
                    match f.read(&mut buf).await {
                        Ok(0) => None,
                        Ok(n) => {
                            buf.truncate(n);
                            Some((Ok(Bytes::from(buf)), f))
                        }
                        Err(e) => Some((Err(e), f)),
                    }
                });
                Ok(Some((len, Box::pin(stream))))
            }
            Self::Object { store, prefix, .. } => {
                match store.get(&Self::object_path(prefix, id)).await {
                    Ok(r) => {
                        let len = r.meta.size;
                        let s = r.into_stream().map(|c| c.map_err(std::io::Error::other));
                        Ok(Some((len, Box::pin(s))))
                    }
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    /// Whether a trace is stored, without reading it (a HEAD on object stores).
    pub async fn exists(&self, id: &TraceId) -> anyhow::Result<bool> {
        match self {
            Self::Local { root } => Ok(tokio::fs::try_exists(
                root.join("traces").join(format!("{id}.msgpack")),
            )
            .await?),
            Self::Object { store, prefix, .. } => {
                match store.head(&Self::object_path(prefix, id)).await {
                    Ok(_) => Ok(true),
                    Err(object_store::Error::NotFound { .. }) => Ok(false),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    /// Every stored trace (for retention only; never exposed over HTTP).
    pub async fn list(&self) -> anyhow::Result<Vec<StoredTrace>> {
        let mut out = Vec::new();
        match self {
            Self::Local { root } => {
                let mut dir = tokio::fs::read_dir(root.join("traces")).await?;
                while let Some(e) = dir.next_entry().await? {
                    let name = e.file_name();
                    let Some(id) = name
                        .to_str()
                        .and_then(|n| n.strip_suffix(".msgpack"))
                        .and_then(|n| TraceId::parse(n).ok())
                    else {
                        continue;
                    };
                    let m = e.metadata().await?;
                    out.push(StoredTrace {
                        id,
                        size_bytes: m.len(),
                        modified: m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    });
                }
            }
            Self::Object { store, prefix, .. } => {
                let mut s = store.list(Some(prefix));
                while let Some(meta) = s.next().await {
                    let meta = meta?;
                    let Some(id) = meta
                        .location
                        .filename()
                        .and_then(|n| n.strip_suffix(".msgpack"))
                        .and_then(|n| TraceId::parse(n).ok())
                    else {
                        continue;
                    };
                    out.push(StoredTrace {
                        id,
                        size_bytes: meta.size,
                        modified: meta.last_modified.into(),
                    });
                }
            }
        }
        Ok(out)
    }

    pub async fn delete(&self, id: &TraceId) -> anyhow::Result<()> {
        match self {
            Self::Local { root } => {
                tokio::fs::remove_file(root.join("traces").join(format!("{id}.msgpack"))).await?
            }
            Self::Object { store, prefix, .. } => {
                store.delete(&Self::object_path(prefix, id)).await?
            }
        }
        Ok(())
    }
}
