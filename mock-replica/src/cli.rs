//! Command-line flags.
//!
//! Hand-parsed: three flags do not justify a CLI dependency in the crate.

use std::fmt;

pub const USAGE: &str = "usage: tollgate-mock-replica [--listen 127.0.0.1:0] [--threads 1] [--model-name NAME]";

#[derive(Debug, PartialEq)]
pub struct Args {
    /// Address to bind; port 0 picks a free port (printed on startup).
    pub listen: String,
    /// Tokio worker threads.
    pub threads: usize,
    /// Overrides the `model` echoed in responses.
    pub model_name: Option<String>,
}

#[derive(Debug, PartialEq)]
pub enum CliError {
    /// `--help` was given: print usage and exit successfully.
    Help,
    Invalid(String),
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Help => f.write_str(USAGE),
            Self::Invalid(msg) => write!(f, "{msg}\n{USAGE}"),
        }
    }
}

impl Args {
    /// Parses the arguments after the program name. Accepts both
    /// `--flag value` and `--flag=value`.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Self, CliError> {
        let mut parsed = Self { listen: "127.0.0.1:0".to_owned(), threads: 1, model_name: None };
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            if arg == "-h" || arg == "--help" {
                return Err(CliError::Help);
            }
            let (flag, inline) = match arg.split_once('=') {
                Some((flag, value)) => (flag.to_owned(), Some(value.to_owned())),
                None => (arg, None),
            };
            let mut value = || {
                inline.clone().or_else(|| args.next()).ok_or_else(|| CliError::Invalid(format!("{flag} needs a value")))
            };
            match flag.as_str() {
                "--listen" => parsed.listen = value()?,
                "--model-name" => parsed.model_name = Some(value()?),
                "--threads" => {
                    let raw = value()?;
                    parsed.threads = raw
                        .parse()
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or_else(|| CliError::Invalid(format!("bad --threads: {raw}")))?;
                }
                _ => return Err(CliError::Invalid(format!("unknown argument: {flag}"))),
            }
        }
        Ok(parsed)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, CliError> {
        Args::parse(args.iter().map(|s| (*s).to_owned()))
    }

    #[test]
    fn defaults() {
        let args = parse(&[]).unwrap();
        assert_eq!(args.listen, "127.0.0.1:0");
        assert_eq!(args.threads, 1);
        assert_eq!(args.model_name, None);
    }

    #[test]
    fn both_flag_forms() {
        let args = parse(&["--listen", "0.0.0.0:8000", "--threads=4", "--model-name", "m"]).unwrap();
        assert_eq!(args.listen, "0.0.0.0:8000");
        assert_eq!(args.threads, 4);
        assert_eq!(args.model_name.as_deref(), Some("m"));
    }

    #[test]
    fn errors() {
        assert_eq!(parse(&["--help"]), Err(CliError::Help));
        assert!(parse(&["--threads", "0"]).is_err());
        assert!(parse(&["--listen"]).is_err());
        assert!(parse(&["--bogus"]).is_err());
    }
}
