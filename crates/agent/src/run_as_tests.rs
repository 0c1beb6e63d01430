//! `run_as`'s rules: the program owner rule, its interpreters, a root-like or shared user, reach.

use super::*;
use std::os::unix::fs::PermissionsExt;

/// The rule on the program file and its directory; relaxed for a non-root user's own.
#[test]
fn a_program_others_could_change_is_refused() {
    if headroom_host::process::effective_uid() != 0 {
        return eprintln!("SKIP a_program_others_could_change_is_refused: needs root (chown)");
    }
    assert_eq!(program_refusal("sh", None), None);
    assert_eq!(
        program_refusal("bu-no-such-program", None),
        None,
        "left to not_runnable"
    );
    let dir = tempfile::tempdir().unwrap();
    let mode =
        |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    mode(dir.path(), 0o755);
    let job = dir.path().join("job");
    std::fs::write(&job, "#!/bin/sh\n").unwrap();
    let path = job.to_str().unwrap();
    mode(&job, 0o755);
    assert_eq!(program_refusal(path, None), None);
    mode(&job, 0o757);
    assert!(program_refusal(path, None).unwrap().contains("chmod o-w"));
    mode(&job, 0o775);
    std::os::unix::fs::chown(&job, None, Some(65534)).unwrap();
    assert!(program_refusal(path, None).unwrap().contains("chmod g-w"));
    mode(&job, 0o755);
    std::os::unix::fs::chown(&job, Some(65534), Some(0)).unwrap();
    let why = program_refusal(path, None).unwrap();
    assert!(why.contains("owned by uid 65534"), "{why}");
    assert_eq!(
        program_refusal(path, Some(65534)),
        None,
        "its owner runs it"
    );
    assert!(
        program_refusal(path, Some(0)).is_some(),
        "root named: as root"
    );
    std::os::unix::fs::chown(&job, Some(0), Some(0)).unwrap();
    mode(dir.path(), 0o777);
    let why = program_refusal(path, None).unwrap();
    assert!(why.contains("directory others could change"), "{why}");
}

#[test]
fn root_be_is_said_by_name() {
    let text = |user: &str| {
        format!(
            "[lc]\nname = \"lc\"\ncgroup = \"a/lc\"\n[[be]]\nname = \"batch\"\ncgroup = \"a/be\"\ncommand = [\"sleep\", \"1\"]\n{user}\n[policy]\nkind = \"static-cores\"\n"
        )
    };
    let root = Config::from_toml_str(&text("")).unwrap();
    let said = root_be_warning(&root).unwrap();
    assert!(said.starts_with("BE runs as root: it can leave its group; set [[be]] user"));
    assert!(said.contains("batch"), "{said}");
    let nobody = Config::from_toml_str(&text("user = \"nobody\"")).unwrap();
    assert_eq!(root_be_warning(&nobody), None);
}

/// Pass 18's low: the rule looked at the script, not at its `#!` interpreter, so a root
/// script naming an interpreter uid 65534 owns ran that user's code as root; through
/// `/usr/bin/env X` and a nested interpreter script too.
#[test]
fn a_script_whose_interpreter_others_could_change_is_refused() {
    if headroom_host::process::effective_uid() != 0 {
        return eprintln!(
            "SKIP a_script_whose_interpreter_others_could_change_is_refused: needs root (chown)"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let mode =
        |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    mode(dir.path(), 0o755);
    let theirs = dir.path().join("l18-interp");
    std::fs::write(&theirs, "#!/bin/sh\n").unwrap();
    mode(&theirs, 0o755);
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let nested = dir.path().join("l18-nested");
    std::fs::write(&nested, format!("#!{}\n", theirs.display())).unwrap();
    mode(&nested, 0o755);
    let job = dir.path().join("job");
    let path = job.to_str().unwrap();
    let script = |first: &str| {
        std::fs::write(&job, format!("{first}\necho hi\n")).unwrap();
        mode(&job, 0o755);
    };
    for fine in [
        "#!/bin/sh",
        "#! /bin/sh -e",
        "#!/usr/bin/env sh",
        "echo no line",
    ] {
        script(fine);
        assert_eq!(program_refusal(path, None), None, "{fine}");
    }
    for bad in [
        format!("#!{}", theirs.display()),
        format!("#! {} -x", theirs.display()),
        format!("#!/usr/bin/env {}", theirs.display()),
        format!("#!/usr/bin/env -S {} -x", theirs.display()),
        format!("#!{}", nested.display()),
    ] {
        script(&bad);
        let why = program_refusal(path, None).unwrap_or_else(|| panic!("{bad}: taken"));
        assert!(why.contains("owned by uid 65534"), "{bad}: {why}");
        assert!(why.contains("l18-interp"), "{bad}: {why}");
    }
    script(&format!("#!{}", theirs.display()));
    assert_eq!(
        program_refusal(path, Some(65534)),
        None,
        "its owner runs it"
    );
}

/// Pass 18's low: a `user` that is uid 0 under another name, or whose group is 0, ran BE
/// as root with no warning; now warned as for no `user`.
#[test]
fn a_be_user_that_is_root_under_another_name_is_warned() {
    let text = |user: &str| {
        format!(
            "[lc]\nname = \"lc\"\ncgroup = \"a/lc\"\n[[be]]\nname = \"batch\"\ncgroup = \"a/be\"\ncommand = [\"sleep\", \"1\"]\n{user}\n[policy]\nkind = \"static-cores\"\n"
        )
    };
    for user in [
        "user = 0",
        "user = \"root\"",
        "user = \"nobody\"\ngroup = 0",
        "user = 65534\ngroup = \"root\"",
    ] {
        let config = Config::from_toml_str(&text(user)).unwrap();
        let said = root_be_warning(&config).unwrap_or_else(|| panic!("{user}: no warning"));
        assert!(
            said.starts_with("BE runs as root: it can leave its group; set [[be]] user"),
            "{user}: {said}"
        );
        assert!(said.contains("batch"), "{said}");
    }
    let nobody = Config::from_toml_str(&text("user = 65534")).unwrap();
    assert_eq!(root_be_warning(&nobody), None);
}

/// Pass 18's low: a BE program its user cannot reach (a directory it cannot search, a
/// file it cannot execute) was taken at start and ended 127 at every restart.
#[test]
fn a_program_the_be_user_cannot_reach_is_refused_at_start() {
    if headroom_host::process::effective_uid() != 0 {
        return eprintln!(
            "SKIP a_program_the_be_user_cannot_reach_is_refused_at_start: needs root"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let mode =
        |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    let job = dir.path().join("job");
    std::fs::write(&job, "#!/bin/sh\n").unwrap();
    let config = Config::from_toml_str(&format!(
        "[lc]\nname = \"lc\"\ncgroup = \"a/lc\"\n[[be]]\nname = \"batch\"\ncgroup = \"a/be\"\ncommand = [{:?}]\nuser = 65534\n[policy]\nkind = \"static-cores\"\n",
        job.to_str().unwrap()
    ))
    .unwrap();
    let said = |dir_mode: u32, job_mode: u32| {
        mode(dir.path(), dir_mode);
        mode(&job, job_mode);
        problems(&config)
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(said(0o755, 0o755), "", "reachable");
    let why = said(0o700, 0o755);
    assert!(why.contains("be[0].command"), "{why}");
    assert!(
        why.contains("uid 65534") && why.contains("may not search"),
        "{why}"
    );
    let why = said(0o755, 0o700);
    assert!(
        why.contains("uid 65534") && why.contains("may not execute"),
        "{why}"
    );
    mode(dir.path(), 0o755);
}

/// Pass 18's low: BE and LC as the same user (`nobody` both) and nothing said.
#[test]
fn a_be_running_as_the_lcs_user_is_warned() {
    let text = |lc_user: &str| {
        format!(
            "[lc]\nname = \"web\"\ncgroup = \"a/lc\"\ncommand = [\"sleep\", \"1\"]\n{lc_user}\n[[be]]\nname = \"batch\"\ncgroup = \"a/be\"\ncommand = [\"sleep\", \"1\"]\nuser = \"nobody\"\n[policy]\nkind = \"static-cores\"\n"
        )
    };
    let same = Config::from_toml_str(&text("user = 65534")).unwrap();
    let said = same_user_warning(&same, |_| None).unwrap();
    assert!(said.contains("may kill or ptrace the LC"), "{said}");
    assert!(said.contains("BE batch and LC web as uid 65534"), "{said}");
    let other = Config::from_toml_str(&text("user = 0")).unwrap();
    assert_eq!(same_user_warning(&other, |_| None), None);
    // An LC given by pid: its process's user (pass 25's low: not warned).
    let by_pid = |uid: u32| {
        let text = "[lc]\nname = \"web\"\ncgroup = \"a/lc\"\npids = [4242]\n[[be]]\nname = \"batch\"\ncgroup = \"a/be\"\ncommand = [\"sleep\", \"1\"]\nuser = \"nobody\"\n[policy]\nkind = \"static-cores\"\n";
        let config = Config::from_toml_str(text).unwrap();
        same_user_warning(&config, |pid| (pid == 4242).then_some(uid))
    };
    let said = by_pid(65534).expect("an LC by pid as nobody, beside BE as nobody");
    assert!(said.contains("BE batch and LC web as uid 65534"), "{said}");
    assert_eq!(by_pid(1000), None);
}

/// Pass 20's lows: the check read the `#!` line as words, so what env `-S` or the kernel
/// reads otherwise (quotes, `\_`, `${VAR}`, a `NAME=value` before the program, a path not
/// UTF-8) and an ELF program's loader (`PT_INTERP`) ran uid 65534's file as root; and a
/// missing interpreter in a directory others can write was left to the exec.
#[test]
fn what_the_interpreter_check_cannot_read_plainly_is_refused() {
    if headroom_host::process::effective_uid() != 0 {
        return eprintln!(
            "SKIP what_the_interpreter_check_cannot_read_plainly_is_refused: needs root (chown)"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let mode =
        |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    mode(dir.path(), 0o755);
    let theirs = dir.path().join("l20-interp");
    std::fs::write(&theirs, "#!/bin/sh\n").unwrap();
    mode(&theirs, 0o755);
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let open = dir.path().join("l20-open");
    std::fs::create_dir(&open).unwrap();
    mode(&open, 0o777);
    let job = dir.path().join("job");
    let path = job.to_str().unwrap();
    let write = |bytes: &[u8]| {
        std::fs::write(&job, bytes).unwrap();
        mode(&job, 0o755);
    };
    let t = theirs.display();
    for (bad, said) in [
        (format!("#!/usr/bin/env -S '{t}'"), "env -S"),
        (format!("#!/usr/bin/env -S \"{t}\" -x"), "env -S"),
        (format!("#!/usr/bin/env -S {t}\\_-x"), "env -S"),
        ("#!/usr/bin/env -S ${L20}".to_string(), "env -S"),
        (
            format!("#!/usr/bin/env -S PATH={} l20-interp", dir.path().display()),
            "PATH=",
        ),
        (
            format!("#!{}/l20-nothing", open.display()),
            "does not exist",
        ),
        (
            format!("#!/usr/bin/env {}/l20-nothing", open.display()),
            "does not exist",
        ),
    ] {
        write(format!("{bad}\n").as_bytes());
        let why = program_refusal(path, None).unwrap_or_else(|| panic!("{bad}: taken"));
        assert!(why.contains(said), "{bad}: {why}");
    }
    let mut line = b"#!".to_vec();
    line.extend_from_slice(dir.path().to_str().unwrap().as_bytes());
    line.extend_from_slice(b"/l20-\xffinterp\n");
    write(&line);
    let why = program_refusal(path, None).expect("a line not UTF-8 taken");
    assert!(why.contains("not UTF-8"), "{why}");
    // An ELF file (64-bit, little-endian) whose loader is theirs.
    write(&elf_naming(&theirs));
    let why = program_refusal(path, None).expect("an ELF file naming their loader taken");
    assert!(
        why.contains("owned by uid 65534") && why.contains("l20-interp"),
        "{why}"
    );
    for fine in [
        "#!/usr/bin/env -S sh -e".to_string(),
        "#!/l20-no-such-dir/sh".to_string(),
        format!("#!/usr/bin/env -S {t}"),
    ] {
        write(format!("{fine}\n").as_bytes());
        assert_eq!(program_refusal(path, Some(65534)), None, "{fine}");
    }
}

/// A minimal 64-bit little-endian ELF header with one program header, `PT_INTERP` `loader`.
fn elf_naming(loader: &Path) -> Vec<u8> {
    let name = loader.to_str().unwrap().as_bytes();
    let mut f = vec![0u8; 64 + 56];
    f[..8].copy_from_slice(b"\x7fELF\x02\x01\x01\x00");
    f[0x10..0x12].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    f[0x12..0x14].copy_from_slice(&0x3eu16.to_le_bytes());
    f[0x14..0x18].copy_from_slice(&1u32.to_le_bytes());
    f[0x20..0x28].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
    f[0x34..0x36].copy_from_slice(&64u16.to_le_bytes());
    f[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
    f[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
    let ph = &mut f[64..];
    ph[..4].copy_from_slice(&3u32.to_le_bytes()); // PT_INTERP
    ph[8..16].copy_from_slice(&120u64.to_le_bytes());
    ph[0x20..0x28].copy_from_slice(&(name.len() as u64 + 1).to_le_bytes());
    f.extend_from_slice(name);
    f.push(0);
    f
}

/// Pass 22's low: with root's `PATH` beginning with a 0777 directory, uid 65534 put `sleep`
/// there and a root BE's restart ran it. A `PATH` directory searched before the program's own
/// that others could change (or make: it does not exist, under one they can write) is refused;
/// after it, or a path given, is not.
#[test]
fn a_path_directory_others_could_change_before_the_programs_is_refused() {
    let mode =
        |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    let good = tempfile::tempdir().unwrap();
    mode(good.path(), 0o755);
    let job = good.path().join("p22-job");
    std::fs::write(&job, "#!/bin/sh\n").unwrap();
    mode(&job, 0o755);
    let open = tempfile::tempdir().unwrap();
    mode(open.path(), 0o777);
    let search = |dirs: &[&Path]| std::env::join_paths(dirs).unwrap();
    let before = search(&[open.path(), good.path()]);
    let why = program_refusal_in("p22-job", None, Some(&before)).expect("refused");
    assert!(
        why.contains(&format!(
            "PATH directory {} is searched before {}",
            open.path().display(),
            good.path().display()
        )),
        "{why}"
    );
    let not_yet = open.path().join("bin");
    let made_later = search(&[&not_yet, good.path()]);
    assert!(
        program_refusal_in("p22-job", None, Some(&made_later)).is_some(),
        "a directory not made yet, under one others can write"
    );
    let after = search(&[good.path(), open.path()]);
    assert_eq!(program_refusal_in("p22-job", None, Some(&after)), None);
    assert_eq!(
        program_refusal_in(job.to_str().unwrap(), None, Some(&before)),
        None,
        "a path is not searched"
    );
    mode(open.path(), 0o755);
    assert_eq!(program_refusal_in("p22-job", None, Some(&before)), None);
}

/// Hostile pass 29's low: a `PATH` directory that is a link to nothing passed the rule (it
/// climbed to the nearest directory that exists), and uid 65534 then made the link's target
/// in /tmp with its own program there: a root BE's restart ran it as root.
#[test]
fn a_path_directory_that_links_to_nothing_is_refused() {
    let mode =
        |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    let good = tempfile::tempdir().unwrap();
    mode(good.path(), 0o755);
    let job = good.path().join("p29-job");
    std::fs::write(&job, "#!/bin/sh\n").unwrap();
    mode(&job, 0o755);
    let links = tempfile::tempdir().unwrap();
    mode(links.path(), 0o755);
    let dangle = links.path().join("dangle");
    std::os::unix::fs::symlink(links.path().join("nothing"), &dangle).unwrap();
    let search = |dirs: &[&Path]| std::env::join_paths(dirs).unwrap();
    for before in [dangle.clone(), dangle.join("bin")] {
        let path = search(&[&before, good.path()]);
        let why = program_refusal_in("p29-job", None, Some(&path)).expect("refused");
        assert!(
            why.contains(&format!("{} is a link to nothing", dangle.display())),
            "{why}"
        );
    }
    // a link to a directory that exists is held to the rule as that directory
    std::fs::create_dir(links.path().join("nothing")).unwrap();
    mode(&links.path().join("nothing"), 0o755);
    let path = search(&[&dangle, good.path()]);
    assert_eq!(program_refusal_in("p29-job", None, Some(&path)), None);
}
