//! The running kernel's build configuration, where the system exposes it: `/proc/config.gz`
//! (CONFIG_IKCONFIG_PROC) or `/boot/config-<release>` (what distributions install). It lets
//! doctor say "kernel has CONFIG_X, hardware lacks Y" or "kernel lacks CONFIG_X" instead of
//! guessing from a missing file.

use std::collections::HashMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};

/// One option's setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    /// `=y`: built in.
    BuiltIn,
    /// `=m`: a module (it may not be loaded).
    Module,
    /// `# CONFIG_X is not set`, or absent from a config that was read.
    Off,
}

/// The parsed configuration and where it came from.
#[derive(Debug, Clone)]
pub struct KernelConfig {
    options: HashMap<String, String>,
    source: PathBuf,
}

/// Why no configuration could be read (the paths tried).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoKernelConfig {
    pub tried: Vec<PathBuf>,
}

impl std::fmt::Display for NoKernelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tried: Vec<String> = self.tried.iter().map(|p| p.display().to_string()).collect();
        write!(f, "kernel config not readable ({})", tried.join(", "))
    }
}

impl KernelConfig {
    /// Reads `<root>/proc/config.gz`, else `<root>/boot/config-<release>`. `system_path` maps a
    /// system path below the host root; `shown` is the system path named in messages.
    pub fn load(
        system_path: impl Fn(&str) -> PathBuf,
        release: Option<&str>,
    ) -> Result<KernelConfig, NoKernelConfig> {
        let mut tried = vec![PathBuf::from("/proc/config.gz")];
        if let Ok(text) = read_gz(&system_path("/proc/config.gz")) {
            return Ok(KernelConfig::parse(&text, "/proc/config.gz"));
        }
        if let Some(release) = release {
            let boot = format!("/boot/config-{release}");
            tried.push(PathBuf::from(&boot));
            if let Ok(text) = std::fs::read_to_string(system_path(&boot)) {
                return Ok(KernelConfig::parse(&text, &boot));
            }
        }
        Err(NoKernelConfig { tried })
    }

    /// Parses `CONFIG_X=value` lines; comments (including "is not set") are left out.
    pub fn parse(text: &str, source: impl AsRef<Path>) -> KernelConfig {
        let options = text
            .lines()
            .filter_map(|l| l.split_once('='))
            .filter(|(k, _)| k.starts_with("CONFIG_"))
            .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
            .collect();
        KernelConfig {
            options,
            source: source.as_ref().to_path_buf(),
        }
    }

    /// Where the configuration was read.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// The setting of `option` (with its `CONFIG_` prefix).
    pub fn setting(&self, option: &str) -> Setting {
        match self.options.get(option).map(String::as_str) {
            Some("y") => Setting::BuiltIn,
            Some("m") => Setting::Module,
            Some("n") | None => Setting::Off,
            // Numeric and string options: present means on.
            Some(_) => Setting::BuiltIn,
        }
    }

    /// `CONFIG_X=y` / `CONFIG_X=m` / `CONFIG_X off`, with the file it was read from.
    pub fn describe(&self, option: &str) -> String {
        match self.setting(option) {
            Setting::BuiltIn | Setting::Module => format!(
                "{option}={}",
                self.options.get(option).map_or("y", String::as_str)
            ),
            Setting::Off => format!("{option} off"),
        }
    }
}

fn read_gz(path: &Path) -> std::io::Result<String> {
    let file = std::fs::File::open(path)?;
    let mut text = String::new();
    flate2::read::GzDecoder::new(file).read_to_string(&mut text)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_builtin_module_and_not_set() {
        let c = KernelConfig::parse(
            "# comment\nCONFIG_A=y\nCONFIG_B=m\n# CONFIG_C is not set\nCONFIG_HZ=250\n",
            "/boot/config-x",
        );
        assert_eq!(c.setting("CONFIG_A"), Setting::BuiltIn);
        assert_eq!(c.setting("CONFIG_B"), Setting::Module);
        assert_eq!(c.setting("CONFIG_C"), Setting::Off);
        assert_eq!(c.setting("CONFIG_D"), Setting::Off);
        assert_eq!(c.setting("CONFIG_HZ"), Setting::BuiltIn);
        assert_eq!(c.describe("CONFIG_B"), "CONFIG_B=m");
        assert_eq!(c.describe("CONFIG_C"), "CONFIG_C off");
    }
}
