//! A node's labels, shared by the copies of the node a pass makes.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

/// A node's labels (`key` → `value`). A GPU node carries tens of them (feature discovery, cloud,
/// topology), and a controller pass copies each of thousands of nodes four times (the cached
/// conversion, the snapshot, the planner's working copy, a group's template for each new node):
/// the copies share one map, and a copy that changes its labels gets its own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Labels(Arc<BTreeMap<String, String>>);

impl Deref for Labels {
    type Target = BTreeMap<String, String>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl DerefMut for Labels {
    fn deref_mut(&mut self) -> &mut Self::Target {
        Arc::make_mut(&mut self.0)
    }
}

impl From<BTreeMap<String, String>> for Labels {
    fn from(map: BTreeMap<String, String>) -> Self {
        Labels(Arc::new(map))
    }
}

impl<const N: usize> From<[(String, String); N]> for Labels {
    fn from(pairs: [(String, String); N]) -> Self {
        Labels(Arc::new(pairs.into()))
    }
}

impl FromIterator<(String, String)> for Labels {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(iter: I) -> Self {
        Labels(Arc::new(iter.into_iter().collect()))
    }
}

impl<'a> IntoIterator for &'a Labels {
    type Item = (&'a String, &'a String);
    type IntoIter = std::collections::btree_map::Iter<'a, String, String>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl Serialize for Labels {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Labels {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        BTreeMap::deserialize(deserializer).map(Self::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_shares_the_labels_until_it_changes_them() {
        let original: Labels = [("zone".to_string(), "a".to_string())].into();
        let mut copy = original.clone();
        assert!(Arc::ptr_eq(&original.0, &copy.0));
        copy.insert("zone".into(), "b".into());
        assert!(!Arc::ptr_eq(&original.0, &copy.0));
        assert_eq!(original.get("zone").map(String::as_str), Some("a"));
        assert_eq!(copy.get("zone").map(String::as_str), Some("b"));
    }

    #[test]
    fn serialised_as_the_plain_map() {
        let labels: Labels = [("a".to_string(), "1".to_string())].into();
        let json = serde_json::to_string(&labels).unwrap();
        assert_eq!(json, r#"{"a":"1"}"#);
        assert_eq!(serde_json::from_str::<Labels>(&json).unwrap(), labels);
    }
}
