//! A YAML mapping whose keys must be distinct. Serde's maps keep the last of a repeated key
//! without a word; a pool named twice in `upstreams.yaml` would silently drop the first.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserialize, Deserializer, Error, MapAccess, Visitor};

/// The entries in file order; a repeated key is a parse error naming it.
pub(super) struct UniqueKeys<V>(pub Vec<(String, V)>);

impl<'de, V: Deserialize<'de>> Deserialize<'de> for UniqueKeys<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Entries<V>(PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for Entries<V> {
            type Value = UniqueKeys<V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut entries: Vec<(String, V)> = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    if entries.iter().any(|(seen, _)| *seen == key) {
                        return Err(A::Error::custom(format!("`{key}` is listed twice")));
                    }
                    let value = map.next_value()?;
                    entries.push((key, value));
                }
                Ok(UniqueKeys(entries))
            }
        }
        d.deserialize_map(Entries(PhantomData))
    }
}
