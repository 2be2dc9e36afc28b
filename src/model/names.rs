//! Kubernetes' syntax rules for names, label keys and values (apimachinery's
//! `pkg/util/validation`), for snapshots and for the names a config gives Kubernetes objects.

/// Longest name part of a qualified name and longest label value (`qualifiedNameMaxLength`,
/// `LabelValueMaxLength`).
const NAME_MAX: usize = 63;
/// Longest DNS-1123 subdomain (`DNS1123SubdomainMaxLength`).
const SUBDOMAIN_MAX: usize = 253;

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`: the name part of a label key and a label value.
fn is_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`: lower-case alphanumerics and `-`, starting and ending
/// alphanumeric (a subdomain's parts have no length limit of their own, only the whole).
fn is_dns1123_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// `IsDNS1123Subdomain`: dot-separated DNS-1123 labels, at most 253 characters.
pub fn dns1123_subdomain(s: &str) -> Result<(), String> {
    if s.len() > SUBDOMAIN_MAX {
        return Err(format!("must be no more than {SUBDOMAIN_MAX} characters"));
    }
    if s.split('.').all(is_dns1123_part) {
        Ok(())
    } else {
        Err("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', \
             and must start and end with an alphanumeric character"
            .into())
    }
}

/// `IsDNS1123Label`, for namespaces.
pub fn dns1123_label(s: &str) -> Result<(), String> {
    if s.len() <= NAME_MAX && is_dns1123_part(s) {
        Ok(())
    } else {
        Err("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', start and \
             end with an alphanumeric character, and be at most 63 characters"
            .into())
    }
}

/// `IsQualifiedName`: label keys, annotation keys, taint keys: an optional DNS-subdomain prefix
/// and `/`, then a name part of at most 63 characters.
pub fn qualified_name(s: &str) -> Result<(), String> {
    let name = match s.split_once('/') {
        Some(("", _)) => return Err("prefix part must be non-empty".into()),
        Some((prefix, name)) => {
            dns1123_subdomain(prefix).map_err(|e| format!("prefix part {e}"))?;
            name
        }
        None => s,
    };
    if name.contains('/') {
        return Err("a qualified name has at most one '/'".into());
    }
    if name.is_empty() {
        return Err("name part must be non-empty".into());
    }
    if name.len() > NAME_MAX {
        return Err(format!("name part must be no more than {NAME_MAX} characters"));
    }
    if !is_name_part(name) {
        return Err(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end \
                    with an alphanumeric character"
                .into(),
        );
    }
    Ok(())
}

/// `IsValidLabelValue`: empty, or a name part of at most 63 characters.
pub fn label_value(s: &str) -> Result<(), String> {
    if s.len() > NAME_MAX {
        return Err(format!("must be no more than {NAME_MAX} characters"));
    }
    if s.is_empty() || is_name_part(s) {
        Ok(())
    } else {
        Err("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and \
             must start and end with an alphanumeric character"
            .into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// apimachinery `pkg/util/validation/validation_test.go`, `TestIsQualifiedName`.
    #[test]
    fn qualified_names_as_apimachinery_judges_them() {
        let long_prefix = format!("{}/{}", "a".repeat(253), "b".repeat(63));
        for good in [
            "simple",
            "now-with-dashes",
            "1-starts-with-num",
            "1234",
            "simple/simple",
            "now-with-dashes/simple",
            "now-with-dashes/now-with-dashes",
            "now.with.dots/simple",
            "now-with.dashes-and.dots/simple",
            "1-num.2-num/3-num",
            "1234/5678",
            "1.2.3.4/5678",
            "Uppercase_Is_OK_123",
            "example.com/Uppercase_Is_OK_123",
            "requests.storage-foo",
            &"a".repeat(63),
            &long_prefix,
        ] {
            assert_eq!(qualified_name(good), Ok(()), "{good}");
        }
        let too_long_prefix = format!("{}/abc", "a".repeat(254));
        for bad in [
            "nospecialchars%^=@",
            "cantendwithadash-",
            "-cantstartwithadash-",
            "only/one/slash",
            "Example.com/abc",
            "example_com/abc",
            "example.com/",
            "/simple",
            &"a".repeat(64),
            &too_long_prefix,
        ] {
            assert!(qualified_name(bad).is_err(), "{bad}");
        }
    }

    /// apimachinery `TestIsValidLabelValue`.
    #[test]
    fn label_values_as_apimachinery_judges_them() {
        for good in
            ["simple", "now-with-dashes", "1-starts-with-num", "end-with-num-1", "1234", &"a".repeat(63), ""]
        {
            assert_eq!(label_value(good), Ok(()), "{good}");
        }
        for bad in [
            "nospecialchars%^=@",
            "Tama-nui-te-rā.is_Māori.sun",
            "\\backslashes\\are\\bad",
            "-starts-with-dash",
            "ends-with-dash-",
            ".starts.with.dot",
            "ends.with.dot.",
            &"a".repeat(64),
            "Amazon EC2 g6.12xlarge",
        ] {
            assert!(label_value(bad).is_err(), "{bad}");
        }
    }

    /// apimachinery `TestIsDNS1123Subdomain` and `TestIsDNS1123Label`.
    #[test]
    fn names_and_namespaces() {
        for good in [
            "a",
            "ab",
            "abc",
            "a1",
            "a-1",
            "a--1--2--b",
            "0",
            "01",
            "a.a",
            "1.a",
            "a.b-c.d",
            &"a".repeat(253),
        ] {
            assert_eq!(dns1123_subdomain(good), Ok(()), "{good}");
        }
        for bad in
            ["", "A", "ABC", "aBc", "a@b", "-", "a-", "-a", "a_b", "a..b", ".a", "a.", &"a".repeat(254)]
        {
            assert!(dns1123_subdomain(bad).is_err(), "{bad}");
        }
        assert_eq!(dns1123_label("kube-system"), Ok(()));
        assert!(dns1123_label("a.b").is_err());
        assert!(dns1123_label(&"a".repeat(64)).is_err());
    }
}
