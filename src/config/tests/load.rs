//! `Config::load`: the file, its data directory, and a missing file.

use super::*;

#[test]
fn load_reads_a_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("proxy.toml");
    std::fs::write(&path, one_key()).expect("write");
    let config = Config::load(&path).expect("valid file");
    assert_eq!(config.keys[0].name, "a");
}

/// Every shape of config path a user types, with and without `data_dir`: the directory is
/// never empty (a bare `proxy.toml` has the parent `""`), always absolute, and the file's own
/// directory unless `data_dir` says otherwise.
#[test]
fn data_dir_is_the_config_files_directory_for_every_path_shape() {
    let cwd = std::env::current_dir().expect("a current directory");
    let cases: [(&str, Option<&str>, PathBuf); 10] = [
        ("proxy.toml", None, cwd.clone()),
        ("./proxy.toml", None, cwd.join(".")),
        ("conf/proxy.toml", None, cwd.join("conf")),
        ("../proxy.toml", None, cwd.join("..")),
        (
            "/etc/keyrelay/proxy.toml",
            None,
            PathBuf::from("/etc/keyrelay"),
        ),
        ("/proxy.toml", None, PathBuf::from("/")),
        ("proxy.toml", Some("state"), cwd.join("state")),
        ("conf/proxy.toml", Some("state"), cwd.join("conf/state")),
        (
            "proxy.toml",
            Some("/var/lib/keyrelay"),
            PathBuf::from("/var/lib/keyrelay"),
        ),
        ("/", None, cwd.clone()),
    ];
    for (path, configured, want) in cases {
        let got = data_dir_for(Path::new(path), configured.map(PathBuf::from));
        assert_eq!(got, want, "config {path:?}, data_dir {configured:?}");
        assert!(got.is_absolute() && !got.as_os_str().is_empty(), "{got:?}");
    }
}

#[test]
fn load_of_a_bare_file_name_gives_a_usable_data_dir() {
    // The shipped file, by the relative name the README uses; cargo runs tests from the
    // package root, where it is.
    let config = Config::load(Path::new("proxy.toml")).expect("the shipped proxy.toml loads");
    let dir = config.data_dir.expect("load always sets data_dir");
    assert_eq!(dir, std::env::current_dir().expect("a current directory"));
    assert!(dir.is_dir(), "{dir:?}");
}

#[test]
fn load_names_a_missing_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("missing.toml");
    let error = Config::load(&path).expect_err("missing");
    let ConfigError::Io { path: reported, .. } = &error else {
        panic!("expected Io, got {error}");
    };
    assert_eq!(reported, &path);
    let shown = error.to_string();
    assert!(
        shown.starts_with(&format!("cannot read {}: ", path.display())),
        "{shown}"
    );
    assert!(std::error::Error::source(&error).is_some());
}
