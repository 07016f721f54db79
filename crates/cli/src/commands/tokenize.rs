//! `redline tokenize -m FILE (-p TEXT | -f TEXTFILE) [--no-bos] [--ids]`: the token ids of a
//! text under a GGUF's tokenizer, printed like llama.cpp's `llama-tokenize`: one
//! `    id -> 'piece'` line per token, or with `--ids` one JSON array.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use engine::Tokenizer;
use gguf::GgufFile;

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["prompt", "file"])))]
pub struct Args {
    /// The GGUF model (or vocab-only GGUF) whose tokenizer to use.
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    /// Text to tokenize.
    #[arg(short = 'p', long = "prompt")]
    pub prompt: Option<String>,
    /// Read the text from this file (UTF-8, used as is, trailing newline included).
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Do not add the BOS token even if the model's metadata asks for it.
    #[arg(long)]
    pub no_bos: bool,
    /// Treat control tokens written in the text (`<|im_start|>`) as plain text.
    #[arg(long)]
    pub no_parse_special: bool,
    /// Print only a JSON array of the ids.
    #[arg(long)]
    pub ids: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let text = match (&args.prompt, &args.file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("cannot read {} as UTF-8 text", f.display()))?,
        (None, None) => anyhow::bail!("give the text with -p TEXT or -f FILE"),
    };
    let file = GgufFile::open(&args.model)
        .with_context(|| format!("cannot read {} as GGUF", args.model.display()))?;
    let tokenizer = Tokenizer::from_gguf(file.metadata())
        .with_context(|| format!("{} has no usable tokenizer", args.model.display()))?;
    let ids = tokenizer.encode(&text, !args.no_bos, !args.no_parse_special)?;

    let mut out = String::new();
    if args.ids {
        // llama-tokenize's spacing: "[1, 2, 3]".
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        out.push_str(&format!("[{}]\n", list.join(", ")));
    } else {
        for &id in &ids {
            let piece = tokenizer.token_to_piece(id);
            match std::str::from_utf8(&piece) {
                Ok(s) => out.push_str(&format!("{id:6} -> '{s}'\n")),
                // A byte token that is part of a multi-byte character.
                Err(_) => out.push_str(&format!(
                    "{id:6} -> '{}' (utf-8 decode failure)\n",
                    String::from_utf8_lossy(&piece)
                )),
            }
        }
    }
    // `redline tokenize … | head` closes the pipe early: not an error.
    match std::io::stdout().lock().write_all(out.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}
