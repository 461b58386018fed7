//! Components: WebAssembly component files kept by the SHA-256 of their
//! bytes, so that the hosts of a pipeline can fetch a new version of the
//! circuit that another host published. A name is the hash of its bytes,
//! so an object is written once and never changes; collection, which
//! deletes only manifests and segments, never touches one.

use crate::error::backend_error;
use crate::store::ObjectCheckpointStore;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use sha2::{Digest, Sha256};
use sluice_storage::{Result, StorageError};
use std::sync::Arc;

/// The directory components lie in (under the store's prefix).
const COMPONENTS: &str = "components";

impl ObjectCheckpointStore {
    /// Publishes a component's bytes under `components/{sha256}.wasm` and
    /// returns the hash (SHA-256 of the bytes, lower-case hex).
    ///
    /// Create-only: an object already there under that name is left as it
    /// is (the same name stands for the same bytes, which
    /// [`get_component`](Self::get_component) checks).
    pub fn put_component(&self, bytes: &[u8]) -> Result<String> {
        let hash = sha256(bytes);
        let store: Arc<dyn ObjectStore> = self.store.clone();
        let path = self.child(COMPONENTS, &format!("{hash}.wasm"));
        let payload = PutPayload::from(bytes.to_vec());
        self.run(async move {
            let create = object_store::PutOptions {
                mode: object_store::PutMode::Create,
                ..Default::default()
            };
            match store.put_opts(&path, payload.clone(), create).await {
                // Already there: the same name holds the same bytes.
                Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
                // No conditional writes here: a plain one writes the same
                // bytes again, which changes nothing.
                Err(object_store::Error::NotImplemented { .. })
                | Err(object_store::Error::NotSupported { .. }) => store
                    .put(&path, payload)
                    .await
                    .map(|_| ())
                    .map_err(backend_error(format!("writing {path}"))),
                Err(e) => Err(backend_error(format!("writing {path}"))(e)),
            }
        })?;
        Ok(hash)
    }

    /// The bytes of component `hash` (SHA-256 of the bytes, lower-case
    /// hex), or `None` if no component of that hash was published.
    ///
    /// A `hash` that is not 64 lower-case hex characters is a
    /// configuration error; bytes that do not hash to `hash` are corrupt.
    pub fn get_component(&self, hash: &str) -> Result<Option<Vec<u8>>> {
        check_hash(hash)?;
        let store: Arc<dyn ObjectStore> = self.store.clone();
        let path = self.child(COMPONENTS, &format!("{hash}.wasm"));
        let got = self.run(async move {
            match store.get(&path).await {
                Ok(got) => got
                    .bytes()
                    .await
                    .map(|b| Some(b.to_vec()))
                    .map_err(backend_error(format!("reading {path}"))),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(backend_error(format!("reading {path}"))(e)),
            }
        })?;
        let Some(bytes) = got else {
            return Ok(None);
        };
        let actual = sha256(&bytes);
        if actual != hash {
            return Err(StorageError::Corrupt {
                what: format!("component {hash}"),
                message: format!(
                    "its {} bytes in {} hash to {actual}",
                    bytes.len(),
                    self.describe
                ),
            });
        }
        Ok(Some(bytes))
    }
}

/// The SHA-256 of `bytes`, in lower-case hex.
fn sha256(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// Refuses a `hash` that is not 64 lower-case hex characters (the only
/// text a component's name is built from).
fn check_hash(hash: &str) -> Result<()> {
    let valid = hash.len() == 64 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if valid {
        Ok(())
    } else {
        Err(StorageError::Config(sluice_core::ConfigError::Invalid(
            format!("component hash {hash:?}: not a SHA-256 in lower-case hex (64 characters)"),
        )))
    }
}
