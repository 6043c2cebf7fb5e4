//! The AppUI end to end in headless Chromium, driven over WebDriver (chromedriver): a real
//! server with the scripted model, a real browser, and assertions on what the page shows.
//!
//! The tests need the Debian packages `chromium` and `chromium-driver`; without them they fail
//! and say so, unless `AGENTD_SKIP_BROWSER_TESTS=1`. A failing test leaves a screenshot in
//! `<target>/browser-screenshots/<test>.png`. With `AGENTD_APPUI_SCREENSHOT=<path>`, the
//! background-task test also saves a picture of the app in use there (docs/appui.png).

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use agentd::config::{Config, ModelCard, ModelPrice, PluginConfig, ProviderConfig};
use agentd::session::profiles::AgentProfile;
use agentd::tools::{Effects, Tool, ToolContext, ToolError, ToolMeta, ToolResult};
use fantoccini::wd::TimeoutConfiguration;
use fantoccini::{Client, ClientBuilder, Locator};
use futures_util::FutureExt;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::Notify;

use crate::support::mock_llm::{MockLlm, Reply, Script, ScriptedCall};
use crate::support::{TestApp, WAIT};

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";
const MODEL: &str = "test-model";

/// Shorthands every condition and script may use.
const PRELUDE: &str = r#"
const $$ = (selector) => Array.from(document.querySelectorAll(selector));
const tid = (id) => `[data-testid="${id}"]`;
const texts = (selector) => $$(selector).map((el) => el.textContent);
"#;

/// The browser binaries, or `None` when the run opted out of browser tests.
fn binaries() -> Option<(PathBuf, PathBuf)> {
    let driver = std::env::var_os("AGENTD_CHROMEDRIVER").map_or(CHROMEDRIVER.into(), PathBuf::from);
    let chromium = std::env::var_os("AGENTD_CHROMIUM").map_or(CHROMIUM.into(), PathBuf::from);
    let missing: Vec<String> = [&driver, &chromium]
        .into_iter()
        .filter(|path| !path.exists())
        .map(|path| path.display().to_string())
        .collect();
    if missing.is_empty() {
        return Some((driver, chromium));
    }
    if std::env::var("AGENTD_SKIP_BROWSER_TESTS").as_deref() == Ok("1") {
        eprintln!("browser test skipped (AGENTD_SKIP_BROWSER_TESTS=1); missing {missing:?}");
        return None;
    }
    panic!(
        "the browser tests need Chromium and chromedriver, missing {missing:?}: install the Debian \
         packages with `apt-get install -y chromium chromium-driver` (or set \
         AGENTD_SKIP_BROWSER_TESTS=1 to skip these tests)"
    );
}

/// A headless Chromium behind its own chromedriver, both ended when this is closed or dropped.
struct Browser {
    client: Client,
    driver: Child,
}

impl Drop for Browser {
    fn drop(&mut self) {
        // chromedriver leads its own process group, which Chromium joins: end them all.
        if let Some(pid) = self
            .driver
            .id()
            .and_then(|id| rustix::process::Pid::from_raw(id as i32))
        {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}

impl Browser {
    async fn start() -> Option<Self> {
        let (driver_path, chromium) = binaries()?;
        let port = {
            let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            probe.local_addr().unwrap().port()
        };
        let mut driver = Command::new(&driver_path)
            .arg(format!("--port={port}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|err| panic!("{} does not start: {err}", driver_path.display()));
        let mut lines = BufReader::new(driver.stdout.take().unwrap()).lines();
        tokio::time::timeout(WAIT, async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if line.contains("started successfully") {
                    return;
                }
            }
            panic!("chromedriver ended before it was ready");
        })
        .await
        .expect("chromedriver starts in time");
        // Keep draining its output so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1440,900",
                         "--force-prefers-reduced-motion"],
            }),
        );
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .expect("a Chromium session starts");
        let browser = Self { client, driver };
        browser
            .client
            .update_timeouts(TimeoutConfiguration::new(
                Some(WAIT + Duration::from_secs(10)),
                Some(WAIT),
                Some(Duration::ZERO),
            ))
            .await
            .unwrap();
        Some(browser)
    }

    async fn close(mut self) {
        let client = self.client.clone();
        let _ = tokio::time::timeout(WAIT, client.close()).await;
        let _ = self.driver.kill().await;
    }

    async fn goto(&self, url: &str) {
        self.client.goto(url).await.expect("the page loads");
    }

    /// Runs a script (with the prelude) and returns what it returns.
    async fn js(&self, script: &str) -> Value {
        self.client
            .execute(&format!("{PRELUDE}\n{script}"), Vec::new())
            .await
            .unwrap_or_else(|err| panic!("script failed: {err}\n{script}"))
    }

    /// Waits until the JavaScript expression `condition` is truthy and returns its value. The
    /// page re-checks on every DOM change (and every 100 ms for state outside the DOM); the
    /// wait fails after [`WAIT`].
    async fn wait(&self, what: &str, condition: &str) -> Value {
        let script = format!(
            r#"{PRELUDE}
const done = arguments[arguments.length - 1];
const check = () => {{ try {{ return ({condition}); }} catch (err) {{ return null; }} }};
let finished = false;
let observer, timer, ticker;
const finish = (value) => {{
  if (finished) return;
  finished = true;
  observer.disconnect(); clearTimeout(timer); clearInterval(ticker);
  done(value);
}};
const recheck = () => {{ const value = check(); if (value) finish(value); }};
observer = new MutationObserver(recheck);
observer.observe(document, {{ subtree: true, childList: true, characterData: true, attributes: true }});
ticker = setInterval(recheck, 100);
timer = setTimeout(() => finish(null), {ms});
recheck();
"#,
            ms = WAIT.as_millis()
        );
        let value = self
            .client
            .execute_async(&script, Vec::new())
            .await
            .unwrap_or_else(|err| panic!("waiting for {what} failed: {err}"));
        assert!(
            !value.is_null() && value != json!(false),
            "timed out waiting for {what}: {condition}"
        );
        value
    }

    async fn find(&self, selector: &str) -> fantoccini::elements::Element {
        self.client
            .find(Locator::Css(selector))
            .await
            .unwrap_or_else(|err| panic!("no element {selector}: {err}"))
    }

    async fn click(&self, selector: &str) {
        // A list the page re-renders between the find and the click leaves a stale element:
        // find it again, a bounded number of times.
        for attempt in 1.. {
            match self.find(selector).await.click().await {
                Ok(_) => return,
                Err(err) if attempt < 5 && err.to_string().contains("stale element") => continue,
                Err(err) => panic!("cannot click {selector}: {err}"),
            }
        }
    }

    /// Replaces the text of an input or textarea.
    async fn fill(&self, selector: &str, text: &str) {
        let field = self.find(selector).await;
        field.clear().await.unwrap();
        field.send_keys(text).await.unwrap();
    }

    /// Waits for the page to be connected and showing a session; returns the session id.
    async fn live_session(&self) -> String {
        let id = self
            .wait(
                "a live session",
                r#"document.querySelector(tid('connection-status')).dataset.status === 'live'
                   && new URL(location.href).searchParams.get('session')"#,
            )
            .await;
        id.as_str().unwrap().to_string()
    }

    async fn screenshot(&self, path: &Path) {
        if let Ok(png) = self.client.screenshot().await {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, png).unwrap();
        }
    }
}

/// Runs `body` with a fresh browser; when it fails, saves a screenshot before failing.
async fn in_browser(test: &str, body: impl AsyncFnOnce(&Browser)) {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let outcome = AssertUnwindSafe(body(&browser)).catch_unwind().await;
    if outcome.is_err() {
        let target = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().unwrap();
        let path = target
            .join("browser-screenshots")
            .join(format!("{test}.png"));
        browser.screenshot(&path).await;
        eprintln!("screenshot of the failure: {}", path.display());
    }
    browser.close().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

fn with_model(mock: &MockLlm) -> impl FnOnce(&mut Config) + use<> {
    let url = mock.base_url();
    move |c: &mut Config| {
        c.llm.base_url = Some(url);
        c.llm.model = Some(MODEL.into());
        c.llm
            .pricing
            .insert(MODEL.into(), ModelCard::priced(ModelPrice::new(3.0, 15.0)));
    }
}

/// A spawn_only plugin running a shell script.
fn plugin(dir: &Path, name: &str, script: &str, args: Vec<String>) -> PluginConfig {
    let path = dir.join(format!("{name}.sh"));
    std::fs::write(&path, script).unwrap();
    let mut perms = std::fs::metadata(&path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&path, perms).unwrap();
    PluginConfig {
        name: name.into(),
        description: format!("{name}, a background test program"),
        command: path.to_string_lossy().into_owned(),
        args,
        spawn_only: true,
        tags: vec!["runtime".into()],
        exclusive: false,
        timeout_ms: 600_000,
        input_schema: json!({"type": "object"}),
    }
}

/// Reads the session's total cost over REST.
async fn session_cost(app: &TestApp, session: &str) -> f64 {
    app.get_json(&format!("/api/sessions/{session}/cost"), None)
        .await["session_cost_usd"]
        .as_f64()
        .unwrap()
}

#[tokio::test]
async fn app_files_are_served_with_their_types_and_stay_public_under_auth() {
    let app = TestApp::spawn_with(|c| {
        c.server.auth_token = Some(agentd::config::Secret::new("s3cret"));
    })
    .await;
    let client = reqwest::Client::new();
    for (path, content_type) in [
        ("/", "text/html; charset=utf-8"),
        ("/app/main.js", "text/javascript; charset=utf-8"),
        ("/app/connection.js", "text/javascript; charset=utf-8"),
        ("/app/app.css", "text/css; charset=utf-8"),
    ] {
        let response = client.get(app.url(path)).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path} is public");
        assert_eq!(response.headers()["content-type"], content_type, "{path}");
        assert_eq!(response.headers()["x-content-type-options"], "nosniff");
        assert!(
            response.headers()["content-security-policy"]
                .to_str()
                .unwrap()
                .contains("script-src 'self'"),
            "{path}"
        );
    }
    let page = client
        .get(app.url("/"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains(r#"<script type="module" src="app/main.js">"#),
        "{page}"
    );

    let (status, body) = app.get("/app/nope.js", None).await;
    assert_eq!(status, 404);
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["code"], "not_found");
    assert_eq!(app.get("/app/..%2Fopenapi.yaml", None).await.0, 404);
    assert_eq!(app.get("/app/x/main.js", None).await.0, 404);
    assert_eq!(
        app.get("/api/sessions", None).await.0,
        401,
        "the API is not"
    );
}

/// Hands the user a file of the workspace, as a tool that produces a report would.
struct Handout;

#[async_trait::async_trait]
impl Tool for Handout {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "handout",
                "Offers report.txt as a download.",
                json!({"type": "object"}),
                Effects::NONE,
            )
        });
        &META
    }
    async fn call(&self, _ctx: &ToolContext, _args: &Value) -> Result<ToolResult, ToolError> {
        let mut result = ToolResult::ok("here is the report");
        result.files_to_send = vec!["report.txt".into()];
        Ok(result)
    }
}

#[tokio::test]
async fn a_fresh_page_opens_a_session_and_works_without_a_model() {
    let app = TestApp::spawn_with_tools(|_| {}, vec![Arc::new(Handout)]).await;
    std::fs::create_dir_all(app.workspace()).unwrap();
    std::fs::write(app.workspace().join("hello.txt"), "hi\n").unwrap();
    std::fs::write(app.workspace().join("report.txt"), "all good\n").unwrap();
    let url = app.url("/");
    in_browser("a_fresh_page_opens_a_session_and_works_without_a_model", async |b| {
        b.goto(&url).await;
        let session = b.live_session().await;
        let listed = app.get_json("/api/sessions", None).await;
        assert_eq!(listed["sessions"][0]["session_id"], session.as_str());
        b.wait(
            "the session in the list",
            &format!(r#"document.querySelector('[data-testid=session-item][data-session-id="{session}"][aria-current=page]')"#),
        )
        .await;
        b.wait("the no-model banner", "!document.querySelector(tid('no-model-banner')).hidden")
            .await;
        assert_eq!(
            b.js("return document.activeElement.dataset.testid").await,
            "composer-input",
            "ready to type"
        );

        // The tools panel lists the session's tools; a deferred one can be activated.
        let active = b
            .wait(
                "the active tools",
                "texts(tid('tools-active') + ' .tool-item-name').length > 5 && texts(tid('tools-active') + ' .tool-item-name')",
            )
            .await;
        for name in ["read_file", "list_dir", "shell", "update_plan"] {
            assert!(active.as_array().unwrap().contains(&json!(name)), "{name} in {active}");
        }
        b.wait(
            "web_fetch deferred",
            "document.querySelector(tid('tools-deferred') + ' [data-tool-name=web_fetch]')",
        )
        .await;
        b.click("[data-testid=tools-deferred] [data-tool-name=web_fetch] [data-testid=tool-activate]")
            .await;
        b.wait(
            "web_fetch active",
            "document.querySelector(tid('tools-active') + ' [data-tool-name=web_fetch]')",
        )
        .await;

        // Sending a message says there is no model and keeps the text.
        b.fill("[data-testid=composer-input]", "hello there").await;
        b.click("[data-testid=send]").await;
        b.wait(
            "the refusal",
            "texts(tid('conversation-notice')).some((t) => t.includes('No model is configured'))",
        )
        .await;
        assert_eq!(
            b.js("return document.querySelector(tid('composer-input')).value").await,
            "hello there"
        );

        // The console runs any tool; its call shows as a card in the conversation too.
        b.click("[data-testid=banner-console]").await;
        b.find("[data-testid=console-tool]").await.select_by_value("list_dir").await.unwrap();
        b.fill("[data-testid=console-args]", r#"{"path": "."}"#).await;
        b.click("[data-testid=console-invoke]").await;
        let output = b
            .wait(
                "the console's answer",
                "document.querySelector(tid('console-result')).dataset.outcome === 'success' && document.querySelector(tid('console-output')).textContent",
            )
            .await;
        assert!(output.as_str().unwrap().contains("hello.txt"), "{output}");
        b.wait(
            "a list_dir card",
            "document.querySelector('[data-testid=tool-card][data-tool-name=list_dir][data-state=success] [data-testid=tool-preview]')?.textContent.includes('hello.txt')",
        )
        .await;

        // Files a call changed or hands over are offered as downloads.
        b.find("[data-testid=console-tool]").await.select_by_value("write_file").await.unwrap();
        b.fill("[data-testid=console-args]", r#"{"path": "out.txt", "content": "written\n"}"#).await;
        b.click("[data-testid=console-invoke]").await;
        b.find("[data-testid=console-tool]").await.select_by_value("handout").await.unwrap();
        b.fill("[data-testid=console-args]", "{}").await;
        b.click("[data-testid=console-invoke]").await;
        let downloads = b
            .wait(
                "the download links",
                "$$(tid('file-download')).length === 2 && $$(tid('file-download')).map((a) => [a.textContent, a.getAttribute('download')])",
            )
            .await;
        assert_eq!(downloads, json!([["out.txt", "out.txt"], ["report.txt", "report.txt"]]));
        let fetched = b
            .client
            .execute_async(
                "const done = arguments[0]; Promise.all([...document.querySelectorAll('[data-testid=file-download]')].map((a) => fetch(a.href).then((r) => r.text()))).then(done);",
                Vec::new(),
            )
            .await
            .unwrap();
        assert_eq!(fetched, json!(["written\n", "all good\n"]));

        // A plan shows in its panel.
        b.find("[data-testid=console-tool]").await.select_by_value("update_plan").await.unwrap();
        b.fill(
            "[data-testid=console-args]",
            r#"{"explanation": "first things first", "plan": [{"step": "Look around", "status": "completed"}, {"step": "Write it up", "status": "in_progress"}]}"#,
        )
        .await;
        b.click("[data-testid=console-invoke]").await;
        let steps = b
            .wait(
                "the plan",
                "$$(tid('plan-step')).length === 2 && $$(tid('plan-step')).map((s) => [s.dataset.status, s.querySelector(tid('plan-step-text')).textContent])",
            )
            .await;
        assert_eq!(steps[0][0], "completed");
        assert_eq!(steps[1], json!(["in_progress", "Write it up"]));
        assert_eq!(
            b.js("return document.querySelector(tid('plan-explanation')).textContent").await,
            "first things first"
        );

        // A question opens the dialog; the answer reaches the waiting tool.
        b.find("[data-testid=console-tool]").await.select_by_value("request_user_input").await.unwrap();
        b.fill(
            "[data-testid=console-args]",
            r#"{"questions": [{"id": "db", "header": "Database", "question": "Which one?"}]}"#,
        )
        .await;
        b.click("[data-testid=console-invoke]").await;
        b.wait("the question", "document.querySelector(tid('questions-dialog')).open").await;
        b.fill("[data-testid=question-answer]", "sqlite").await;
        b.click("[data-testid=question-submit]").await;
        let answered = b
            .wait(
                "the answered call",
                "!document.querySelector(tid('questions-dialog')).open && document.querySelector(tid('console-result')).dataset.outcome === 'success' && document.querySelector(tid('console-output')).textContent",
            )
            .await;
        assert!(answered.as_str().unwrap().contains("sqlite"), "{answered}");
    })
    .await;
}

#[tokio::test]
async fn a_turn_streams_text_and_tool_cards_and_comes_back_after_a_reload() {
    let release = Arc::new(Notify::new());
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::text_then_tool_calls(
            &["Let me look around."],
            vec![ScriptedCall::whole(
                "call_look",
                "list_dir",
                &json!({"path": "."}),
            )],
        )
        .with_usage(1000, 40),
        Reply::hold(
            &["Here is **what** I ", "found"],
            release.clone(),
            &[": `notes.txt`.\n\n<img src=x onerror=\"window.__pwned = 1\"> stays text. [a link](javascript:document.title=1) and [docs](https://example.com/docs)"],
        )
        .with_usage(1500, 60),
    ]))
    .await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    std::fs::create_dir_all(app.workspace()).unwrap();
    std::fs::write(app.workspace().join("notes.txt"), "remember\n").unwrap();
    let url = app.url("/");
    in_browser("a_turn_streams_text_and_tool_cards_and_comes_back_after_a_reload", async |b| {
        b.goto(&url).await;
        let session = b.live_session().await;
        assert_eq!(
            b.js("return document.querySelector(tid('no-model-banner')).hidden").await,
            true
        );
        b.fill("[data-testid=composer-input]", "What is in here?").await;
        b.click("[data-testid=send]").await;

        b.wait(
            "the tool card",
            "document.querySelector('[data-testid=tool-card][data-tool-name=list_dir][data-state=success] [data-testid=tool-duration]')?.textContent.endsWith('ms')",
        )
        .await;
        let card = b.js("return document.querySelector(tid('tool-card')).textContent").await;
        assert!(card.as_str().unwrap().contains("notes.txt"), "{card}");
        assert!(!card.as_str().unwrap().contains("null"), "{card}");
        // The second answer is held half-way: what arrived so far is already on the page.
        let partial = b
            .wait(
                "the streamed start of the answer",
                "$$('[data-testid=assistant-message][data-streaming=true]').map((m) => m.textContent).find((t) => t.includes('Here is what I found'))",
            )
            .await;
        assert!(!partial.as_str().unwrap().contains("notes.txt"), "{partial}");
        release.notify_one();
        let footer = b
            .wait(
                "the end of the turn",
                "document.querySelector('[data-testid=turn][data-state=completed] [data-testid=turn-footer]')?.textContent",
            )
            .await;
        assert!(footer.as_str().unwrap().contains("2500 in · 100 out"), "{footer}");

        // Markdown is rendered, and markup from the model stays text.
        let answer = b
            .js("return $$(tid('assistant-message')).map((m) => m.textContent)")
            .await;
        assert_eq!(answer[0], "Let me look around.");
        assert!(answer[1].as_str().unwrap().contains(r#"<img src=x onerror="window.__pwned = 1"> stays text."#), "{answer}");
        assert_eq!(b.js("return $$(tid('messages') + ' img').length").await, 0);
        assert_eq!(b.js("return window.__pwned === undefined").await, true);
        // Only safe link targets become links.
        assert_eq!(
            b.js("return $$(tid('assistant-message') + ' a').map((a) => a.getAttribute('href'))").await,
            json!(["https://example.com/docs"])
        );
        assert_eq!(
            b.js("return $$(tid('assistant-message') + ' strong').map((s) => s.textContent)").await,
            json!(["what"])
        );
        assert_eq!(
            b.js("return $$(tid('assistant-message') + ' code').map((s) => s.textContent)").await,
            json!(["notes.txt"])
        );

        // The cost panel shows what the ledger says.
        let cost = session_cost(&app, &session).await;
        assert!(cost > 0.0);
        let shown = b
            .wait(
                "the session's cost",
                &format!("Math.abs(Number(document.querySelector(tid('cost-total')).dataset.usd) - {cost}) < 1e-12 && document.querySelector(tid('cost-total')).textContent"),
            )
            .await;
        assert_eq!(shown, format!("${cost:.6}"));
        // The rows come from the ledger over REST, after the total the turn's end carried.
        b.wait("a row per model call", "$$(tid('cost-node-row')).length === 2").await;

        // A reload returns to the same session with its history.
        b.client.refresh().await.unwrap();
        assert_eq!(b.live_session().await, session);
        b.wait(
            "the history",
            "texts(tid('user-message')).join() === 'What is in here?' && $$(tid('assistant-message')).length === 2 && $$(tid('tool-card')).length === 1",
        )
        .await;
        let after = b
            .js("return $$(tid('assistant-message')).map((m) => m.textContent)")
            .await;
        assert_eq!(after, answer);
        b.wait(
            "the cost after the reload",
            &format!("Math.abs(Number(document.querySelector(tid('cost-total')).dataset.usd) - {cost}) < 1e-12"),
        )
        .await;
    })
    .await;
}

#[tokio::test]
async fn a_background_task_fills_its_panel_and_can_be_read_and_cancelled() {
    let scratch = tempfile::tempdir().unwrap();
    let stop = scratch.path().join("stop");
    let ticker = plugin(
        scratch.path(),
        "ticker",
        "#!/bin/sh\ncat >/dev/null\ni=0\nwhile [ ! -e \"$1\" ]; do i=$((i+1)); echo \"line $i\" >&2; sleep 0.02; done\necho \"done after $i lines\"\n",
        vec![stop.to_string_lossy().into_owned()],
    );
    let sleeper = plugin(
        scratch.path(),
        "sleeper",
        "#!/bin/sh\ncat >/dev/null\necho waiting >&2\nwhile true; do sleep 1; done\n",
        Vec::new(),
    );
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::text_then_tool_calls(
            &["I will start the ticker in the background and look at the workspace meanwhile."],
            vec![
                ScriptedCall::whole("call_tick", "ticker", &json!({})),
                ScriptedCall::whole("call_look", "list_dir", &json!({"path": "."})),
            ],
        )
        .with_usage(1800, 50),
        Reply::text(&[
            "The ticker runs as a background task; its output streams into the ",
            "**Background tasks** panel.\n\nMeanwhile, the workspace holds:\n\n",
            "- `README.md`\n- `notes.txt`\n\nI will read its output once it finishes.",
        ])
        .with_usage(2100, 60),
    ]))
    .await;
    let configure = with_model(&mock);
    let scratch_dir = scratch.path().to_path_buf();
    let app = TestApp::spawn_with(move |c| {
        configure(c);
        c.plugins.push(ticker);
        c.plugins.push(sleeper);
        // The stop file lies outside the workspace, where only `extra_read` lets a command look.
        c.sandbox.extra_read.push(scratch_dir);
    })
    .await;
    std::fs::create_dir_all(app.workspace()).unwrap();
    std::fs::write(app.workspace().join("README.md"), "# notes\n").unwrap();
    std::fs::write(app.workspace().join("notes.txt"), "remember\n").unwrap();
    let url = app.url("/");
    in_browser("a_background_task_fills_its_panel_and_can_be_read_and_cancelled", async |b| {
        b.goto(&url).await;
        let session = b.live_session().await;
        b.fill("[data-testid=composer-input]", "Run the ticker, please.").await;
        b.click("[data-testid=send]").await;

        b.wait(
            "the task's output in its row",
            "document.querySelector('[data-testid=task-row][data-state=running] [data-testid=task-output]')?.textContent.includes('line 5\\n')",
        )
        .await;
        b.wait(
            "the card's task link",
            "document.querySelector('[data-testid=tool-card][data-tool-name=ticker] [data-testid=tool-task-link]')",
        )
        .await;
        b.wait("the end of the turn", "document.querySelector('[data-testid=turn][data-state=completed]')").await;

        // "Show more" pages through the stored output: the tail first, then a search.
        b.click("[data-testid=task-row] [data-testid=task-show-more]").await;
        b.wait(
            "the reader's tail",
            "/line \\d+\\n$/.test(document.querySelector(tid('task-viewer-output')).textContent)",
        )
        .await;
        b.find("[data-testid=task-viewer-mode]").await.select_by_value("grep").await.unwrap();
        b.fill("[data-testid=task-viewer-pattern]", "line 3").await;
        b.click("[data-testid=task-viewer-read]").await;
        b.wait(
            "the search",
            "document.querySelector(tid('task-viewer-output')).textContent.startsWith('line 3\\n')",
        )
        .await;
        b.find("[data-testid=task-viewer-mode]").await.select_by_value("head").await.unwrap();
        b.wait(
            "the head",
            "document.querySelector(tid('task-viewer-output')).textContent.startsWith('line 1\\nline 2\\n')",
        )
        .await;

        if let Some(path) = std::env::var_os("AGENTD_APPUI_SCREENSHOT") {
            b.click("[data-testid=task-row] [data-testid=task-show-more]").await;
            b.wait(
                "the cost rows",
                "$$(tid('cost-node-row')).length === 2",
            )
            .await;
            b.js("document.querySelector(tid('composer-input')).value = 'Summarise what the ticker printed.'").await;
            b.screenshot(Path::new(&path)).await;
        }

        std::fs::write(&stop, "").unwrap();
        let state = b
            .wait(
                "the finished task",
                "document.querySelector('[data-testid=task-row][data-state=completed] [data-testid=task-state]')?.textContent",
            )
            .await;
        assert_eq!(state, "completed (exit 0)");
        let result = b
            .wait(
                "the task's result",
                "document.querySelector(tid('task-result'))?.textContent",
            )
            .await;
        assert!(result.as_str().unwrap().starts_with("done after "), "{result}");
        b.wait("the note in the conversation", "document.querySelector(tid('spawn-complete'))").await;

        // A task started from the console can be cancelled from its row.
        b.find("[data-testid=console-tool]").await.select_by_value("sleeper").await.unwrap();
        b.fill("[data-testid=console-args]", "{}").await;
        b.click("[data-testid=console-invoke]").await;
        b.wait(
            "the second task",
            "document.querySelector('[data-testid=task-row][data-state=running] [data-testid=task-output]')?.textContent.includes('waiting')",
        )
        .await;
        b.click("[data-testid=task-row][data-state=running] [data-testid=task-cancel]").await;
        b.wait(
            "the cancelled task",
            "$$('[data-testid=task-row][data-state=cancelled]').length === 1",
        )
        .await;
        let tasks = app.get_json(&format!("/api/sessions/{session}/tasks"), None).await;
        let states: Vec<&str> = tasks["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["state"].as_str().unwrap())
            .collect();
        assert_eq!(states, ["completed", "cancelled"]);
    })
    .await;
}

#[tokio::test]
async fn a_dropped_socket_reconnects_and_resumes_without_duplicates() {
    let app = TestApp::spawn().await;
    let url = app.url("/");
    in_browser("a_dropped_socket_reconnects_and_resumes_without_duplicates", async |b| {
        b.goto(&url).await;
        let session = b.live_session().await;
        let mut ws = app.ws().await;
        let invoke = |name: &str, arguments: Value| {
            json!({"session_id": session, "name": name, "arguments": arguments})
        };
        ws.result("tool/invoke", invoke("list_dir", json!({"path": "."}))).await;
        b.wait("the first card", "$$(tid('tool-card')).length === 1").await;

        // While the page is away, the session goes on; the page catches up once, in order.
        b.js("window.agentd.connection.dropForTest({ hold: true })").await;
        b.wait(
            "the lost connection",
            "document.querySelector(tid('connection-status')).dataset.status === 'reconnecting'",
        )
        .await;
        ws.result(
            "tool/invoke",
            invoke("write_file", json!({"path": "away.txt", "content": "written while away\n"})),
        )
        .await;
        ws.result("tool/invoke", invoke("read_file", json!({"path": "away.txt"}))).await;
        b.js("window.agentd.connection.resumeForTest()").await;
        b.live_session().await;
        let cards = b
            .wait(
                "the missed cards",
                "$$(tid('tool-card')).length >= 3 && $$(tid('tool-card')).map((c) => c.dataset.toolName + ':' + c.dataset.state)",
            )
            .await;
        assert_eq!(cards, json!(["list_dir:success", "write_file:success", "read_file:success"]));
        let log = b.js("return window.agentd.connection.statusLog").await;
        let log: Vec<&str> = log.as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
        let dropped = log.iter().position(|s| *s == "reconnecting").expect("went through reconnecting");
        assert!(log[..dropped].contains(&"live") && log[dropped..].contains(&"live"), "{log:?}");

        // Live events after the resume show up once too.
        ws.result("tool/invoke", invoke("list_dir", json!({"path": "."}))).await;
        b.wait("the fourth card", "$$(tid('tool-card')).length === 4").await;
        let events = app
            .get_json(&format!("/api/sessions/{session}/events?after_seq=0"), None)
            .await;
        let last_seq = events["events"].as_array().unwrap().last().unwrap()["seq"].clone();
        assert_eq!(b.js("return window.agentd.state.lastSeq").await, last_seq);
        // The resume asked only for what was missed: nothing arrived twice.
        assert_eq!(b.js("return window.agentd.state.repeated").await, 0);
        assert_eq!(b.js("return $$(tid('tool-card')).length").await, 4);
    })
    .await;
}

#[tokio::test]
async fn a_token_in_the_page_url_opens_the_api_and_the_socket() {
    let app = TestApp::spawn_with(|c| {
        c.server.auth_token = Some(agentd::config::Secret::new("s3cret/+"));
    })
    .await;
    let (base, with_token) = (app.url("/"), app.url("/?token=s3cret%2F%2B"));
    in_browser("a_token_in_the_page_url_opens_the_api_and_the_socket", async |b| {
        b.goto(&base).await;
        b.wait("the token form", "!document.querySelector(tid('token-form')).hidden").await;

        b.goto(&with_token).await;
        let session = b.live_session().await;
        assert_eq!(
            b.js("return new URL(location.href).searchParams.has('token')").await,
            false,
            "the token leaves the address bar"
        );
        b.wait(
            "the session list over REST",
            &format!(r#"document.querySelector('[data-testid=session-item][data-session-id="{session}"]')"#),
        )
        .await;
        // A reload keeps the token for this tab.
        b.client.refresh().await.unwrap();
        assert_eq!(b.live_session().await, session);
    })
    .await;
}

#[tokio::test]
async fn switching_sessions_and_back_shows_each_whole_history_once() {
    let app = TestApp::spawn().await;
    let url = app.url("/");
    in_browser("switching_sessions_and_back_shows_each_whole_history_once", async |b| {
        b.goto(&url).await;
        let first = b.live_session().await;
        let mut ws = app.ws().await;
        let invoke = |session: &str, name: &str, arguments: Value| {
            json!({"session_id": session, "name": name, "arguments": arguments})
        };
        ws.result("tool/invoke", invoke(&first, "list_dir", json!({"path": "."}))).await;
        b.wait("the first card", "$$(tid('tool-card')).length === 1").await;

        b.click("[data-testid='new-session']").await;
        let second = b
            .wait(
                "another session",
                &format!(
                    "(() => {{ const id = new URL(location.href).searchParams.get('session');
                       return id && id !== '{first}' && $$(tid('tool-card')).length === 0 && id; }})()"
                ),
            )
            .await;
        let second = second.as_str().unwrap().to_string();
        // The first session goes on while the page shows the second; its events stay out.
        for n in 0..3 {
            let path = format!("n{n}.txt");
            ws.result("tool/invoke", invoke(&first, "write_file", json!({"path": path, "content": "x"}))).await;
        }
        ws.result("tool/invoke", invoke(&second, "list_dir", json!({"path": "."}))).await;
        b.wait("the second session's card", "$$(tid('tool-card')).length === 1").await;

        // Back to the first: every card of it, in order, each once.
        b.wait("the first session listed", &format!("document.querySelector(`[data-session-id='{first}']`)")).await;
        b.click(&format!("[data-session-id='{first}']")).await;
        let cards = b
            .wait(
                "the first session's cards",
                "$$(tid('tool-card')).length >= 4 && $$(tid('tool-card')).map((c) => c.dataset.toolName)",
            )
            .await;
        assert_eq!(cards, json!(["list_dir", "write_file", "write_file", "write_file"]));
        let events = app
            .get_json(&format!("/api/sessions/{first}/events?after_seq=0"), None)
            .await;
        let last_seq = events["events"].as_array().unwrap().last().unwrap()["seq"].clone();
        assert_eq!(b.js("return window.agentd.state.lastSeq").await, last_seq);
    })
    .await;
}

/// Reads frames until the answer to request `id` arrives, and returns it.
async fn answer_to(ws: &mut crate::support::WsClient, id: u64) -> Value {
    loop {
        let message = ws.next_json().await;
        if message.get("id") == Some(&json!(id)) {
            return message;
        }
    }
}

#[tokio::test]
async fn a_command_waiting_for_approval_is_decided_from_its_card() {
    let app = TestApp::spawn_with(|c| c.tool_policy.ask = vec!["shell".into()]).await;
    std::fs::create_dir_all(app.workspace()).unwrap();
    let url = app.url("/");
    in_browser("a_command_waiting_for_approval_is_decided_from_its_card", async |b| {
        b.goto(&url).await;
        let session = b.live_session().await;
        let cwd = app.get_json(&format!("/api/sessions/{session}"), None).await["cwd"].clone();
        let mut ws = app.ws().await;
        let shell = |command: &str| {
            json!({"session_id": session, "name": "shell", "arguments": {"command": command}})
        };
        let id = ws.send("tool/invoke", shell("echo approved > approved.txt")).await;

        // The card shows what would run and where, inside the call's card, with focus on Accept.
        let approval_id = b
            .wait(
                "the approval card",
                "document.querySelector('[data-testid=tool-card][data-tool-name=shell] [data-testid=approval-card][data-state=pending]')?.dataset.approvalId",
            )
            .await;
        assert!(approval_id.as_str().unwrap().starts_with("approval_"), "{approval_id}");
        assert_eq!(
            b.js("return document.querySelector(tid('approval-command')).textContent").await,
            "echo approved > approved.txt"
        );
        let shown_cwd = b.js("return document.querySelector(tid('approval-cwd')).textContent").await;
        assert!(!shown_cwd.as_str().unwrap().is_empty(), "{shown_cwd}");
        if let Some(cwd) = cwd.as_str() {
            assert!(shown_cwd.as_str().unwrap().ends_with(cwd.trim_start_matches('.')), "{shown_cwd} vs {cwd}");
        }
        assert_eq!(
            b.js("return document.activeElement.dataset.testid").await,
            "approval-accept",
            "the keyboard can decide at once"
        );
        assert_eq!(
            b.js("return ['approval-accept', 'approval-accept-session', 'approval-decline'].map((id) => document.querySelector(tid(id)).tagName)").await,
            json!(["BUTTON", "BUTTON", "BUTTON"])
        );
        // Escape goes back to the composer and decides nothing.
        b.find("[data-testid=approval-accept]")
            .await
            .send_keys(&fantoccini::key::Key::Escape.to_string())
            .await
            .unwrap();
        assert_eq!(b.js("return document.activeElement.dataset.testid").await, "composer-input");
        assert_eq!(
            b.js("return document.querySelector(tid('approval-card')).dataset.state").await,
            "pending"
        );
        assert!(!app.workspace().join("approved.txt").exists());

        b.click("[data-testid=approval-accept]").await;
        let answer = answer_to(&mut ws, id).await;
        assert_eq!(answer["result"]["success"], true, "{answer}");
        assert_eq!(
            std::fs::read_to_string(app.workspace().join("approved.txt")).unwrap(),
            "approved\n"
        );
        // The decided card gives way to a one-line record in the call's card: who, and what.
        let record = b
            .wait(
                "the record of the accept",
                &format!("!document.querySelector(tid('approval-card')) && document.querySelector('[data-testid=tool-card][data-tool-name=shell]').dataset.state === 'success' && document.querySelector('[data-testid=tool-card][data-tool-name=shell] [data-testid=approval-record][data-approval-id={approval_id}] [data-testid=approval-record-text]')?.textContent"),
            )
            .await;
        assert_eq!(record, "You accepted this call");
        assert_eq!(
            b.js("return document.activeElement.dataset.testid").await,
            "composer-input",
            "the keyboard goes back to the composer"
        );

        // A request still waiting is sent again when the page reconnects: it stays one card.
        let id = ws.send("tool/invoke", shell("echo no > declined.txt")).await;
        let second = b
            .wait(
                "the second card",
                "document.querySelector('[data-testid=approval-card][data-state=pending]')?.dataset.approvalId",
            )
            .await;
        b.js("window.agentd.connection.dropForTest()").await;
        b.wait(
            "the reconnect",
            "window.agentd.connection.statusLog.filter((s) => s === 'live').length === 2 && window.agentd.connection.status === 'live'",
        )
        .await;
        assert_eq!(
            b.js(&format!("return $$('[data-testid=approval-card][data-approval-id=\"{}\"]').length", second.as_str().unwrap())).await,
            1
        );
        assert_eq!(b.js("return window.agentd.state.repeated").await, 0);

        // Declining sends the message typed for it.
        b.fill("[data-testid=approval-card][data-state=pending] [data-testid=approval-message]", "not that file").await;
        b.click("[data-testid=approval-card][data-state=pending] [data-testid=approval-decline]").await;
        let answer = answer_to(&mut ws, id).await;
        assert_eq!(answer["result"]["success"], false, "{answer}");
        assert_eq!(answer["result"]["structured_metadata"]["error"]["kind"], "declined");
        assert_eq!(answer["result"]["structured_metadata"]["error"]["message"], "not that file");
        assert!(!app.workspace().join("declined.txt").exists());
        let record = b
            .wait(
                "the record of the decline",
                &format!("!document.querySelector(tid('approval-card')) && document.querySelector('[data-testid=approval-record][data-approval-id={second}][data-decision=decline][data-by=you] [data-testid=approval-record-text]')?.textContent"),
            )
            .await;
        assert_eq!(record, "You declined this call");

        // A reload replays both requests with their decisions: nothing waits again, and each
        // decision shows as its record in its call's card.
        b.client.refresh().await.unwrap();
        assert_eq!(b.live_session().await, session);
        let records = b
            .wait(
                "the history",
                "$$('[data-testid=tool-card][data-tool-name=shell]').map((c) => c.dataset.state).join() === 'success,failure' && $$('[data-testid=tool-card] [data-testid=approval-record]').length === 2 && $$(tid('approval-record')).map((r) => [r.dataset.approvalId, r.dataset.decision, r.dataset.by, r.querySelector(tid('approval-record-text')).textContent])",
            )
            .await;
        assert_eq!(
            records,
            json!([
                [approval_id, "accept", "person", "A person accepted this call"],
                [second, "decline", "person", "A person declined this call"]
            ])
        );
        assert_eq!(b.js("return $$(tid('approval-card')).length").await, 0);
        assert_eq!(b.js("return document.activeElement.dataset.testid").await, "composer-input");
    })
    .await;
}

/// Waits until the test releases it: keeps a turn's tool batch in flight.
struct Waiter(Arc<Notify>);

#[async_trait::async_trait]
impl Tool for Waiter {
    fn meta(&self) -> &ToolMeta {
        static META: LazyLock<ToolMeta> = LazyLock::new(|| {
            ToolMeta::new(
                "wait_for_release",
                "Waits until released.",
                json!({"type": "object"}),
                Effects::NONE,
            )
        });
        &META
    }
    async fn call(&self, _ctx: &ToolContext, _args: &Value) -> Result<ToolResult, ToolError> {
        self.0.notified().await;
        Ok(ToolResult::ok("released"))
    }
}

#[tokio::test]
async fn the_composer_steers_a_running_turn() {
    let release = Arc::new(Notify::new());
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::tool_calls(vec![ScriptedCall::whole(
            "call_wait",
            "wait_for_release",
            &json!({}),
        )]),
        Reply::text(&["Steered."]),
        Reply::text(&["A new turn."]),
    ]))
    .await;
    let configure = with_model(&mock);
    let app = TestApp::spawn_with_tools(configure, vec![Arc::new(Waiter(release.clone()))]).await;
    let url = app.url("/");
    in_browser("the_composer_steers_a_running_turn", async |b| {
        b.goto(&url).await;
        b.live_session().await;
        assert_eq!(b.js("return document.querySelector(tid('send')).textContent").await, "Send");
        b.fill("[data-testid=composer-input]", "Start the work.").await;
        b.click("[data-testid=send]").await;
        b.wait(
            "the waiting call and a composer that steers",
            "document.querySelector('[data-testid=tool-card][data-tool-name=wait_for_release][data-state=running]') && document.querySelector(tid('send')).textContent === 'Steer' && document.querySelector(tid('composer-input')).placeholder.startsWith('Steer')",
        )
        .await;

        b.fill("[data-testid=composer-input]", "use sqlite, not postgres").await;
        b.click("[data-testid=send]").await;
        b.wait(
            "the steer in the running turn",
            "document.querySelector('[data-testid=turn][data-state=running] [data-testid=steer-message][data-state=sent]')?.textContent === 'use sqlite, not postgres'",
        )
        .await;
        assert_eq!(mock.request_count(), 1, "the steer waits for the batch");
        release.notify_one();
        b.wait("the end of the turn", "$$('[data-testid=turn][data-state=completed]').length === 1").await;
        let second = &mock.requests()[1];
        let messages: Vec<(&str, &str)> = second["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| (m["role"].as_str().unwrap(), m["content"].as_str().unwrap_or_default()))
            .collect();
        assert_eq!(
            messages.iter().map(|(role, _)| *role).collect::<Vec<_>>(),
            ["system", "user", "assistant", "tool", "user"],
            "{messages:?}"
        );
        assert_eq!(messages[4].1, "use sqlite, not postgres");
        assert_eq!(b.js("return document.querySelector(tid('send')).textContent").await, "Send");
        assert_eq!(
            b.js("return texts(tid('user-message'))").await,
            json!(["Start the work."]),
            "a steer is not a turn of its own"
        );

        // A turn that ends just as the steer is sent: the text starts the next turn instead.
        b.js("window.agentd.state.emit('turn/started', { turn_id: 'turn_over_already' })").await;
        b.wait("a composer that steers", "document.querySelector(tid('send')).textContent === 'Steer'").await;
        b.fill("[data-testid=composer-input]", "And then?").await;
        b.click("[data-testid=send]").await;
        b.wait(
            "the next turn",
            "$$('[data-testid=turn][data-state=completed]').length === 2 && texts(tid('user-message')).includes('And then?')",
        )
        .await;
        assert_eq!(b.js("return $$(tid('steer-message')).length").await, 1);
        let third = &mock.requests()[2];
        let last = third["messages"].as_array().unwrap().last().unwrap().clone();
        assert_eq!(last, json!({"role": "user", "content": "And then?"}));

        // After a reload, the steer shows in its turn, read from the stored conversation.
        b.client.refresh().await.unwrap();
        b.live_session().await;
        let shown = b
            .wait(
                "the history with its steer",
                "texts(tid('user-message')).join('|') === 'Start the work.|And then?' && $$(tid('steer-message')).length === 1 && $$(tid('turn')).map((t) => texts('[data-turn-id=\"' + t.dataset.turnId + '\"] [data-testid=steer-message]').join())",
            )
            .await;
        assert_eq!(shown, json!(["use sqlite, not postgres", ""]));
    })
    .await;
}

#[tokio::test]
async fn a_finished_turn_forks_into_a_new_session() {
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::text(&["First answer."]),
        Reply::text(&["Second answer."]),
        Reply::text(&["An answer in the fork."]),
    ]))
    .await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    let url = app.url("/");
    in_browser("a_finished_turn_forks_into_a_new_session", async |b| {
        b.goto(&url).await;
        let source = b.live_session().await;
        for (n, text) in ["First question", "Second question"].into_iter().enumerate() {
            b.fill("[data-testid=composer-input]", text).await;
            b.click("[data-testid=send]").await;
            b.wait(
                "the end of the turn",
                &format!("$$('[data-testid=turn][data-state=completed] [data-testid=fork-turn]').length === {}", n + 1),
            )
            .await;
        }
        // Each finished turn forks at the seq of its last event.
        let events = app
            .get_json(&format!("/api/sessions/{source}/events?after_seq=0"), None)
            .await;
        let ends: Vec<Value> = events["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["method"] == "turn/completed")
            .map(|e| e["params"]["seq"].clone())
            .collect();
        let seqs = b
            .js("return $$(tid('fork-turn')).map((button) => Number(button.dataset.seq))")
            .await;
        assert_eq!(seqs, json!(ends), "{events}");

        b.click("[data-testid=turn] [data-testid=fork-turn]").await;
        let fork = b
            .wait(
                "the fork",
                &format!(
                    "(() => {{ const id = new URL(location.href).searchParams.get('session');
                       return id && id !== '{source}' && document.querySelector(tid('connection-status')).dataset.status === 'live'
                         && texts(tid('user-message')).join('|') === 'First question'
                         && texts(tid('assistant-message')).join('|') === 'First answer.' && id; }})()"
                ),
            )
            .await;
        let fork = fork.as_str().unwrap().to_string();
        let row = app.get_json(&format!("/api/sessions/{fork}"), None).await;
        assert_eq!(row["parent_session_id"], source.as_str(), "{row}");
        b.wait(
            "the fork in the session list",
            &format!(r#"document.querySelector('[data-testid=session-item][data-session-id="{fork}"][aria-current=page]')"#),
        )
        .await;

        // The fork goes on from the first turn's history.
        b.fill("[data-testid=composer-input]", "Go on from here").await;
        b.click("[data-testid=send]").await;
        b.wait("the fork's own turn", "$$('[data-testid=turn][data-state=completed]').length === 2").await;
        let third = &mock.requests()[2];
        let contents: Vec<&str> = third["messages"]
            .as_array()
            .unwrap()
            .iter()
            .skip(1)
            .map(|m| m["content"].as_str().unwrap_or_default())
            .collect();
        assert_eq!(contents, ["First question", "First answer.", "Go on from here"]);

        // Back returns to the source, whole.
        b.client.back().await.unwrap();
        b.wait(
            "the source again",
            &format!(
                "new URL(location.href).searchParams.get('session') === '{source}' && texts(tid('user-message')).join('|') === 'First question|Second question'"
            ),
        )
        .await;
    })
    .await;
}

const REVIEWER_SAYS: &str = "You review changes; you never edit files.";

#[tokio::test]
async fn a_new_session_opens_as_the_agent_profile_chosen_and_shows_its_badge() {
    let mock = MockLlm::start(Script::always(Reply::text(&["Looks fine."]))).await;
    let configure = with_model(&mock);
    let app = TestApp::spawn_with(move |c: &mut Config| {
        configure(c);
        c.agents.push(AgentProfile {
            name: "reviewer".into(),
            description: "Reads and comments; cannot write".into(),
            instructions: Some(REVIEWER_SAYS.into()),
            model: Some(MODEL.into()),
            tool_policy: None,
        });
    })
    .await;
    let url = app.url("/");
    in_browser(
        "a_new_session_opens_as_the_agent_profile_chosen_and_shows_its_badge",
        async |b| {
            b.goto(&url).await;
            let plain = b.live_session().await;

            // The picker offers a plain agent (chosen) and the profile, with what it is.
            let offered = b
                .wait(
                    "the agent picker",
                    "!document.querySelector(tid('new-session-agent-picker')).hidden && [document.querySelector(tid('new-session-agent')).value, texts(tid('new-session-agent') + ' option'), document.querySelector(tid('new-session-agent-about')).hidden]",
                )
                .await;
            assert_eq!(
                offered,
                json!(["", ["plain agent", "reviewer — Reads and comments; cannot write · model test-model"], true])
            );
            b.find("[data-testid=new-session-agent]").await.select_by_value("reviewer").await.unwrap();
            assert_eq!(
                b.js("return document.querySelector(tid('new-session-agent-about')).textContent").await,
                "Reads and comments; cannot write · model test-model"
            );

            // + New session opens the next session as the profile.
            b.click("[data-testid=new-session]").await;
            let reviewed = b
                .wait(
                    "the new session, as the reviewer",
                    &format!(
                        "(() => {{ const id = new URL(location.href).searchParams.get('session');
                           const badge = document.querySelector(tid('session-agent-badge'));
                           return id && id !== '{plain}' && document.querySelector(tid('connection-status')).dataset.status === 'live'
                             && !badge.hidden && badge.textContent === 'reviewer' && id; }})()"
                    ),
                )
                .await;
            let reviewed = reviewed.as_str().unwrap().to_string();
            let listed = app.get_json("/api/sessions", None).await;
            let agent_of = |id: &str| {
                listed["sessions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|row| row["session_id"] == id)
                    .unwrap_or_else(|| panic!("{id} listed: {listed}"))
                    .get("agent")
                    .cloned()
            };
            assert_eq!(agent_of(&reviewed), Some(json!("reviewer")), "{listed}");
            assert_eq!(agent_of(&plain), None, "{listed}");

            // The list marks the profile's session, and only it.
            let badges = b
                .wait(
                    "the badge in the list",
                    "$$(tid('session-item')).length === 2 && $$(tid('session-agent')).length === 1 && $$(tid('session-agent')).map((badge) => [badge.closest(tid('session-item')).dataset.sessionId, badge.dataset.agent, badge.textContent])",
                )
                .await;
            assert_eq!(badges, json!([[reviewed, "reviewer", "reviewer"]]));

            // Its turns run as the profile: its instructions reach the model.
            b.fill("[data-testid=composer-input]", "Check my change").await;
            b.click("[data-testid=send]").await;
            b.wait("the end of the turn", "document.querySelector('[data-testid=turn][data-state=completed]')").await;
            let system = mock.requests()[0]["messages"][0]["content"].to_string();
            assert!(system.contains(REVIEWER_SAYS), "{system}");

            // A profile the server does not know is refused, said so, and the page stays put.
            b.js("const select = document.querySelector(tid('new-session-agent')); select.append(new Option('writer', 'writer')); select.value = 'writer';").await;
            b.click("[data-testid=new-session]").await;
            let refusal = b
                .wait(
                    "the refusal",
                    "document.querySelector('[data-testid=conversation-notice][data-code=invalid_params]')?.textContent",
                )
                .await;
            let refusal = refusal.as_str().unwrap();
            assert!(refusal.starts_with("The session was not created as writer:"), "{refusal}");
            assert!(refusal.contains("reviewer"), "the profiles are named: {refusal}");
            assert_eq!(
                b.js("return new URL(location.href).searchParams.get('session')").await,
                reviewed.as_str()
            );
            assert_eq!(app.get_json("/api/sessions", None).await["sessions"].as_array().unwrap().len(), 2);
        },
    )
    .await;
}

#[tokio::test]
async fn cached_prompt_tokens_show_on_the_turn_and_in_the_cost_panel() {
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::text(&["hi"]).with_usage(1000, 10).with_cached(600),
    ]))
    .await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    let url = app.url("/");
    in_browser("cached_prompt_tokens_show_on_the_turn_and_in_the_cost_panel", async |b| {
        b.goto(&url).await;
        b.live_session().await;
        b.fill("[data-testid=composer-input]", "Say hi.").await;
        b.click("[data-testid=send]").await;
        let tokens = b
            .wait(
                "the end of the turn",
                "document.querySelector('[data-testid=turn][data-state=completed] [data-testid=turn-tokens]')?.textContent",
            )
            .await;
        assert_eq!(tokens, "1000 in (600 cached) · 10 out");
        assert_eq!(
            b.js("return $$(tid('turn-stopped')).length").await,
            0,
            "a turn the model finished needs no notice"
        );

        // The ledger over REST, read after the turn's end: the totals, the turn, the call.
        let expected = json!([
            "1000 in (600 cached) · 10 out",
            "600",
            ["1000 (600 cached) / 10"],
            ["1000 (600 cached) / 10"]
        ]);
        let panel = "$$(tid('cost-node-row')).length === 1 && [document.querySelector(tid('cost-tokens')).textContent, document.querySelector(tid('cost-tokens')).dataset.cached, texts(tid('cost-turn-row') + ' td:nth-child(2)'), texts(tid('cost-node-row') + ' td:nth-child(3)')]";
        assert_eq!(b.wait("the cost panel", panel).await, expected);

        // A reload shows the same: the footer from the replayed turn/completed, the panel from
        // the ledger.
        b.client.refresh().await.unwrap();
        b.live_session().await;
        b.wait(
            "the footer after the reload",
            "document.querySelector('[data-testid=turn][data-state=completed] [data-testid=turn-tokens]')?.textContent === '1000 in (600 cached) · 10 out'",
        )
        .await;
        assert_eq!(b.wait("the cost panel after the reload", panel).await, expected);
    })
    .await;
}

#[tokio::test]
async fn a_turn_the_server_stops_says_why() {
    // The same call with the same answer, again and again: the server ends the turn.
    let looping = MockLlm::start(Script::always(Reply::tool_calls(vec![
        ScriptedCall::whole("again", "read_file", &json!({"path": "same.txt"})),
    ])))
    .await;
    let stuck = TestApp::spawn_with(with_model(&looping)).await;
    std::fs::create_dir_all(stuck.workspace()).unwrap();
    std::fs::write(stuck.workspace().join("same.txt"), "nothing new\n").unwrap();
    // 1000 prompt tokens at 3 USD per million plus 20 out at 15: 0.0033 USD a call.
    let (spending, fast) = super::long_sessions::a_fast_spender(with_model).await;
    let (stuck_url, fast_url) = (stuck.url("/"), fast.url("/"));
    in_browser("a_turn_the_server_stops_says_why", async |b| {
        b.goto(&stuck_url).await;
        let session = b.live_session().await;
        b.fill("[data-testid=composer-input]", "Read same.txt.").await;
        b.click("[data-testid=send]").await;
        let notice = b
            .wait(
                "the loop notice",
                "document.querySelector('[data-testid=turn][data-state=completed][data-reason=stuck_in_loop] [data-testid=turn-stopped][data-reason=stuck_in_loop]')?.textContent",
            )
            .await;
        assert_eq!(notice, "Stopped: the model kept repeating the same call with the same result");
        assert_eq!(looping.request_count(), 6);
        assert_eq!(b.js("return $$(tid('tool-card')).length").await, 6);
        // The turn completed (its calls and cost stand): no error, and a footer that forks.
        assert_eq!(b.js("return $$(tid('turn-error')).length").await, 0);
        assert_eq!(b.js("return $$(tid('turn-footer') + ' ' + tid('fork-turn')).length").await, 1);

        // The notice is part of the history: a reload shows it again, once.
        b.client.refresh().await.unwrap();
        assert_eq!(b.live_session().await, session);
        b.wait(
            "the history",
            "$$(tid('tool-card')).length === 6 && document.querySelector('[data-testid=turn][data-state=completed]')",
        )
        .await;
        assert_eq!(
            b.js("return $$(tid('turn-stopped')).map((n) => n.dataset.reason)").await,
            json!(["stuck_in_loop"])
        );

        // Spending faster than `[budget] usd_per_minute` ends the turn with its own notice.
        b.goto(&fast_url).await;
        b.live_session().await;
        b.fill("[data-testid=composer-input]", "Go.").await;
        b.click("[data-testid=send]").await;
        let notice = b
            .wait(
                "the rate notice",
                "document.querySelector('[data-testid=turn][data-state=completed] [data-testid=turn-stopped][data-reason=budget_rate_exceeded]')?.textContent",
            )
            .await;
        assert_eq!(notice, "Stopped: the session is spending faster than the per-minute budget allows");
        assert_eq!(spending.request_count(), 1);
    })
    .await;
}

/// The request's last message, when it is the user's and starts with "Summarise": the
/// server's request for a summary of the older conversation.
fn asks_for_a_summary(request: &Value) -> bool {
    let last = request["messages"]
        .as_array()
        .and_then(|messages| messages.last())
        .cloned()
        .unwrap_or_default();
    last["role"] == "user"
        && last["content"]
            .as_str()
            .is_some_and(|text| text.starts_with("Summarise"))
}

#[tokio::test]
async fn compacting_shows_one_divider_through_a_reconnect_and_a_reload() {
    let release = Arc::new(Notify::new());
    let held = release.clone();
    let mock = MockLlm::start(Script::route(move |request| {
        if asks_for_a_summary(request) {
            Reply::text(&["The user asked for a greeting and got one."]).with_usage(900, 30)
        } else {
            Reply::hold(&["Hel"], held.clone(), &["lo."])
        }
    }))
    .await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    let url = app.url("/");
    in_browser("compacting_shows_one_divider_through_a_reconnect_and_a_reload", async |b| {
        b.goto(&url).await;
        let session = b.live_session().await;

        // A fresh session has nothing to compact: the server says so, and the page shows it.
        b.wait("a Compact button", "!document.querySelector(tid('compact')).disabled").await;
        b.click("[data-testid=compact]").await;
        b.wait(
            "the refusal",
            "document.querySelector('[data-testid=conversation-notice][data-code=nothing_to_compact]') && !document.querySelector(tid('compact')).disabled",
        )
        .await;
        assert_eq!(mock.request_count(), 0);

        // While a turn runs there is no compacting.
        b.fill("[data-testid=composer-input]", "Say hello.").await;
        b.click("[data-testid=send]").await;
        b.wait(
            "the running turn",
            "document.querySelector('[data-testid=turn][data-state=running] [data-testid=assistant-message]') && document.querySelector(tid('compact')).disabled",
        )
        .await;
        release.notify_one();
        b.wait(
            "the end of the turn",
            "document.querySelector('[data-testid=turn][data-state=completed]') && !document.querySelector(tid('compact')).disabled",
        )
        .await;
        // The last four messages always stay verbatim: two more turns give it something to do.
        for done in 2..=3 {
            b.fill("[data-testid=composer-input]", "Again.").await;
            b.click("[data-testid=send]").await;
            release.notify_one();
            b.wait(
                "the next turn",
                &format!("$$('[data-testid=turn][data-state=completed]').length === {done} && !document.querySelector(tid('compact')).disabled"),
            )
            .await;
        }

        b.click("[data-testid=compact]").await;
        let shown = b
            .wait(
                "the divider",
                "$$(tid('compacted')).length === 1 && !document.querySelector(tid('compact')).disabled && [document.querySelector(tid('compacted')).textContent, Number(document.querySelector(tid('compacted')).dataset.seq)]",
            )
            .await;
        let requests = mock.requests();
        assert_eq!(requests.len(), 4, "the turns' calls, then the summary");
        assert!(asks_for_a_summary(&requests[3]), "{}", requests[3]);
        let events = app
            .get_json(&format!("/api/sessions/{session}/events?after_seq=0"), None)
            .await;
        let events = events["events"].as_array().unwrap();
        let compacted = events
            .iter()
            .find(|e| e["method"] == "session/compacted")
            .unwrap_or_else(|| panic!("no session/compacted in {events:?}"));
        let p = &compacted["params"];
        let replaced = p["replaced_messages"].as_u64().unwrap();
        let expected = format!(
            "Earlier conversation summarised: {replaced} message{}, ~{} → ~{} tokens",
            if replaced == 1 { "" } else { "s" },
            p["tokens_before"],
            p["tokens_after"]
        );
        assert_eq!(shown, json!([expected, p["seq"]]));
        // It sits where it happened: after the turn, at the end of the conversation.
        let order = "$$(tid('messages') + ' > li').map((li) => li.dataset.testid).filter((id) => id !== 'conversation-notice')";
        assert_eq!(b.js(&format!("return {order}")).await, json!(["turn", "turn", "turn", "compacted"]));
        assert_eq!(
            b.js("return $$('[data-testid=conversation-notice].error').length").await,
            0
        );

        // A reconnect resumes after the last seq: the divider stays one.
        b.js("window.agentd.connection.dropForTest()").await;
        b.wait(
            "the reconnect",
            "window.agentd.connection.statusLog.filter((s) => s === 'live').length === 2 && window.agentd.connection.status === 'live'",
        )
        .await;
        assert_eq!(b.js("return $$(tid('compacted')).length").await, 1);
        assert_eq!(b.js("return window.agentd.state.repeated").await, 0);

        // A reload replays the whole history: the divider once, in its place.
        let last_seq = events.last().unwrap()["seq"].clone();
        b.client.refresh().await.unwrap();
        assert_eq!(b.live_session().await, session);
        b.wait(
            "the whole history",
            &format!("window.agentd.state.lastSeq === {last_seq} && document.querySelector('[data-testid=turn][data-state=completed]')"),
        )
        .await;
        assert_eq!(b.js(&format!("return {order}")).await, json!(["turn", "turn", "turn", "compacted"]));
        assert_eq!(
            b.js("return document.querySelector(tid('compacted')).textContent").await,
            expected
        );
        assert_eq!(
            b.js("return texts(tid('assistant-message'))").await,
            json!(["Hello.", "Hello.", "Hello."]),
            "the stored history is whole"
        );
    })
    .await;
}

/// Starts a server again on the address and the data of one that stopped, so the page that
/// watched it reconnects to it as to a restarted server. `adjust` changes its configuration
/// (the data and workspace directories stay those of `dir`).
async fn restart(
    addr: std::net::SocketAddr,
    dir: &Path,
    adjust: impl FnOnce(&mut Config),
) -> TestApp {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .expect("the stopped server's port is free again");
    let (data, workspace) = (dir.join("data"), dir.join("workspace"));
    TestApp::spawn_on(listener, move |c| {
        adjust(c);
        c.server.data_dir = data;
        c.server.workspace = workspace;
    })
    .await
}

#[tokio::test]
async fn a_restart_with_a_model_updates_the_banner_and_the_tools_without_a_reload() {
    let mock = MockLlm::start(Script::sequence(Vec::new())).await;
    let app = TestApp::spawn().await;
    let url = app.url("/");
    let addr = app.addr;
    let mut app = Some(app);
    in_browser("a_restart_with_a_model_updates_the_banner_and_the_tools_without_a_reload", async |b| {
        b.goto(&url).await;
        let session = b.live_session().await;
        b.wait(
            "the no-model banner and web_fetch deferred",
            "!document.querySelector(tid('no-model-banner')).hidden && document.querySelector(tid('tools-deferred') + ' [data-tool-name=web_fetch]')",
        )
        .await;
        assert_eq!(b.js("return document.querySelector(tid('compact')).disabled").await, true);
        b.js("window.__sameDocument = true").await;

        // The operator configures a model (and forbids web_fetch) and restarts the server.
        let dir = app.take().unwrap().stop().await;
        b.wait(
            "the lost connection",
            "document.querySelector(tid('connection-status')).dataset.status === 'reconnecting'",
        )
        .await;
        let configure = with_model(&mock);
        let restarted = restart(addr, dir.path(), |c| {
            configure(c);
            c.tool_policy.deny = vec!["web_fetch".into()];
        })
        .await;

        // The reconnect's session/open says what the server has now.
        b.wait(
            "the banner gone and the tools read again",
            "document.querySelector(tid('connection-status')).dataset.status === 'live' && document.querySelector(tid('no-model-banner')).hidden && document.querySelector('[data-testid=tools-hidden] [data-tool-name=web_fetch][data-reason=policy_deny]')",
        )
        .await;
        assert_eq!(b.js("return window.__sameDocument === true").await, true, "no reload");
        assert_eq!(b.live_session().await, session, "the same session, resumed");
        assert_eq!(
            b.js("return $$(tid('tools-deferred') + ' [data-tool-name=web_fetch]').length + $$(tid('console-tool') + ' option[value=web_fetch]').length").await,
            0,
            "web_fetch is offered nowhere"
        );
        b.wait("a Compact button", "!document.querySelector(tid('compact')).disabled").await;
        drop(restarted);
    })
    .await;
}

#[tokio::test]
async fn a_read_of_task_output_is_labelled_as_output_not_as_a_background_start() {
    let scratch = tempfile::tempdir().unwrap();
    let quick = plugin(
        scratch.path(),
        "quick",
        "#!/bin/sh\ncat >/dev/null\necho first line\necho second line\n",
        Vec::new(),
    );
    let scratch_dir = scratch.path().to_path_buf();
    let app = TestApp::spawn_with(move |c| {
        c.plugins.push(quick);
        c.sandbox.extra_read.push(scratch_dir);
    })
    .await;
    let url = app.url("/");
    in_browser("a_read_of_task_output_is_labelled_as_output_not_as_a_background_start", async |b| {
        b.goto(&url).await;
        let session = b.live_session().await;
        let mut ws = app.ws().await;
        let started = ws.invoke(&session, "quick", json!({})).await;
        let envelope: Value = serde_json::from_str(started["output"].as_str().unwrap()).unwrap();
        let task = envelope["task_handle"].as_str().unwrap().to_string();
        b.wait(
            "the finished task",
            "document.querySelector('[data-testid=task-row][data-state=completed]')",
        )
        .await;
        let read = ws
            .invoke(&session, "read_task_output", json!({"task_handle": task, "mode": {"kind": "head"}}))
            .await;
        assert_eq!(read["success"], true, "{read}");

        // The call that started the task says so; the call that read its output says that.
        let labels = b
            .wait(
                "both cards",
                "$$('[data-testid=tool-card][data-state=success]').length === 2 && $$(tid('tool-card')).map((c) => [c.dataset.toolName, c.dataset.taskId ?? null, c.querySelector(tid('tool-result-label')).textContent])",
            )
            .await;
        let state = "completed";
        assert_eq!(
            labels,
            json!([
                ["quick", task, "Started in the background (task handle)"],
                ["read_task_output", null, format!("Output of task {} ({state})", &task[..8])]
            ])
        );
        let preview = b
            .js("return document.querySelector('[data-testid=tool-card][data-tool-name=read_task_output] [data-testid=tool-preview]').textContent")
            .await;
        assert!(preview.as_str().unwrap().contains("first line\nsecond line"), "{preview}");
        assert_eq!(
            b.js("return $$('[data-testid=tool-card][data-tool-name=read_task_output] [data-testid=tool-task-link]').length").await,
            0,
            "reading a task starts none"
        );
    })
    .await;
}

#[tokio::test]
async fn a_shell_call_run_in_the_background_shows_as_a_task() {
    let app = TestApp::spawn().await;
    let url = app.url("/");
    in_browser("a_shell_call_run_in_the_background_shows_as_a_task", async |b| {
        b.goto(&url).await;
        let session = b.live_session().await;
        let mut ws = app.ws().await;
        let started = ws
            .invoke(
                &session,
                "shell",
                json!({"command": "echo from the background", "run_in_background": true}),
            )
            .await;
        let envelope: Value = serde_json::from_str(started["output"].as_str().unwrap())
            .unwrap_or_else(|err| panic!("not a task_handle envelope ({err}): {started}"));
        let task = envelope["task_handle"].as_str().unwrap().to_string();
        let card = b
            .wait(
                "the background card and its task",
                &format!(
                    "document.querySelector('[data-testid=task-row][data-task-id=\"{task}\"]') && document.querySelector('[data-testid=tool-card][data-tool-name=shell] [data-testid=tool-task-link]') && [document.querySelector('[data-testid=tool-card][data-tool-name=shell]').dataset.taskId, document.querySelector('[data-testid=tool-card][data-tool-name=shell] [data-testid=tool-result-label]').textContent]"
                ),
            )
            .await;
        assert_eq!(card, json!([task, "Started in the background (task handle)"]));
        b.wait(
            "its output in the tasks panel",
            &format!("document.querySelector('[data-testid=task-row][data-task-id=\"{task}\"][data-state=completed] [data-testid=task-output]')?.textContent.includes('from the background')"),
        )
        .await;
    })
    .await;
}

#[tokio::test]
async fn a_wrong_access_token_says_so() {
    let app = TestApp::spawn_with(|c| {
        c.server.auth_token = Some(agentd::config::Secret::new("s3cret"));
    })
    .await;
    let (base, wrong) = (app.url("/"), app.url("/?token=wrong"));
    in_browser("a_wrong_access_token_says_so", async |b| {
        b.goto(&base).await;
        b.wait("the token form", "!document.querySelector(tid('token-form')).hidden").await;
        assert_eq!(b.js("return document.querySelector(tid('token-error')).hidden").await, true);

        // A wrong token typed in the form: the form stays, and says why.
        b.fill("[data-testid=token-input]", "not-it").await;
        b.click("[data-testid=token-submit]").await;
        let error = b
            .wait(
                "the refusal",
                "!document.querySelector(tid('token-error')).hidden && document.querySelector(tid('token-error')).textContent",
            )
            .await;
        assert_eq!(error, "The server did not accept this token. Check it and try again.");
        assert_eq!(b.js("return sessionStorage.getItem('agentd.token')").await, Value::Null);
        assert_eq!(
            b.js("return document.querySelector(tid('connection-status')).dataset.status").await,
            "offline"
        );

        // A wrong token in the URL: the form says the page's token was refused.
        b.goto(&wrong).await;
        let error = b
            .wait(
                "the refusal of the URL's token",
                "!document.querySelector(tid('token-form')).hidden && !document.querySelector(tid('token-error')).hidden && document.querySelector(tid('token-error')).textContent",
            )
            .await;
        assert!(error.as_str().unwrap().contains("did not accept"), "{error}");

        // The right one opens the app.
        b.fill("[data-testid=token-input]", "s3cret").await;
        b.click("[data-testid=token-submit]").await;
        b.live_session().await;
        assert_eq!(b.js("return document.querySelector(tid('token-form')).hidden").await, true);
    })
    .await;
}

#[tokio::test]
async fn the_app_fits_the_window_with_no_blank_space_below() {
    let app = TestApp::spawn().await;
    let url = app.url("/");
    in_browser(
        "the_app_fits_the_window_with_no_blank_space_below",
        async |b| {
            b.goto(&url).await;
            let session = b.live_session().await;
            let mut ws = app.ws().await;
            // A long plan puts its steps (and their screen-reader text) far below the fold of the
            // panels column; cards fill the conversation.
            let plan: Vec<Value> = (1..=40)
                .map(|n| json!({"step": format!("Step {n}"), "status": "pending"}))
                .collect();
            ws.invoke(&session, "update_plan", json!({"plan": plan}))
                .await;
            for _ in 0..6 {
                ws.invoke(&session, "list_dir", json!({"path": "."})).await;
            }
            b.wait(
                "the plan and the cards",
                "$$(tid('plan-step')).length === 40 && $$('[data-testid=tool-card][data-tool-name=list_dir][data-state=success]').length === 6",
            )
            .await;
            let fits = "document.scrollingElement.scrollHeight <= window.innerHeight";
            let size = b
                .js("return [document.scrollingElement.scrollHeight, window.innerHeight]")
                .await;
            assert_eq!(
                b.js(&format!("return {fits}")).await,
                true,
                "page height vs window: {size}"
            );

            // Moving focus into the panels (the banner's console link) scrolls them, not the page.
            b.click("[data-testid=banner-console]").await;
            b.wait(
                "focus in the console",
                "document.activeElement.dataset.testid === 'console-tool'",
            )
            .await;
            assert_eq!(
                b.js(&format!(
                    "return {fits} && document.scrollingElement.scrollTop === 0"
                ))
                .await,
                true
            );
            let target = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().unwrap();
            b.screenshot(&target.join("browser-screenshots").join("layout.png"))
                .await;
        },
    )
    .await;
}

#[tokio::test]
async fn stop_ends_a_turn_the_server_is_not_running() {
    let app = TestApp::spawn().await;
    let url = app.url("/");
    in_browser("stop_ends_a_turn_the_server_is_not_running", async |b| {
        b.goto(&url).await;
        b.live_session().await;
        // The page believes a turn runs that the server has no record of running (its end
        // never reached the log).
        b.js("window.agentd.state.emit('turn/started', { turn_id: 'turn_gone' })").await;
        b.wait(
            "a running turn",
            "!document.querySelector(tid('interrupt')).hidden && document.querySelector(tid('send')).textContent === 'Steer'",
        )
        .await;
        b.click("[data-testid=interrupt]").await;
        let notice = b
            .wait(
                "the turn ended here",
                "document.querySelector('[data-testid=turn][data-turn-id=turn_gone][data-state=ended] [data-testid=turn-ended]') && document.querySelector(tid('interrupt')).hidden && document.querySelector(tid('send')).textContent === 'Send' && document.querySelector('[data-testid=conversation-notice][data-code=no_turn_running]')?.textContent",
            )
            .await;
        assert!(notice.as_str().unwrap().starts_with("No turn was running"), "{notice}");
        assert!(
            b.js("return document.querySelector(tid('composer-input')).placeholder").await.as_str().unwrap().starts_with("Message the agent"),
        );
    })
    .await;
}

#[tokio::test]
async fn a_turn_open_at_a_restart_is_drawn_ended() {
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::tool_calls(vec![ScriptedCall::whole(
            "call_sh",
            "shell",
            &json!({"command": "echo hi > hi.txt"}),
        )]),
        Reply::text(&["Not reached."]),
    ]))
    .await;
    let with_approval = |mock: &MockLlm| {
        let configure = with_model(mock);
        move |c: &mut Config| {
            configure(c);
            c.tool_policy.ask = vec!["shell".into()];
        }
    };
    let app = TestApp::spawn_with(with_approval(&mock)).await;
    let (url, addr) = (app.url("/"), app.addr);
    let mut app = Some(app);
    in_browser("a_turn_open_at_a_restart_is_drawn_ended", async |b| {
        b.goto(&url).await;
        let session = b.live_session().await;
        b.fill("[data-testid=composer-input]", "Say hi into a file.").await;
        b.click("[data-testid=send]").await;
        b.wait(
            "the approval card",
            "document.querySelector('[data-testid=tool-card][data-tool-name=shell] [data-testid=approval-card]') && document.querySelector(tid('send')).textContent === 'Steer'",
        )
        .await;

        let dir = app.take().unwrap().stop().await;
        let restarted = restart(addr, dir.path(), with_approval(&mock)).await;
        let ended = "document.querySelector(tid('connection-status')).dataset.status === 'live' \
            && !document.querySelector(tid('approval-card')) \
            && document.querySelector('[data-testid=tool-card][data-tool-name=shell]').dataset.state === 'failure' \
            && document.querySelector('[data-testid=turn][data-state=completed][data-reason=server_restarted]') \
            && document.querySelector(tid('send')).textContent === 'Send' && document.querySelector(tid('interrupt')).hidden \
            && [document.querySelector('[data-testid=tool-card][data-tool-name=shell] [data-testid=approval-record]').dataset.decision, \
                document.querySelector(tid('approval-record')).dataset.by, \
                document.querySelector(tid('approval-record')).dataset.reason, \
                document.querySelector(tid('approval-record-text')).textContent, \
                document.querySelector(tid('turn-stopped')).textContent]";
        let expected = json!([
            "decline",
            "server",
            "server_restarted",
            "The server declined this call: the server restarted while the call waited",
            "Stopped: the server restarted while this turn ran"
        ]);
        // The page that watched it reconnects and reads the ends the server wrote at start-up.
        assert_eq!(b.wait("the turn ended after the reconnect", ended).await, expected);
        // A reload draws the same from the whole log.
        b.client.refresh().await.unwrap();
        assert_eq!(b.live_session().await, session);
        assert_eq!(b.wait("the turn ended after a reload", ended).await, expected);
        assert_eq!(b.js("return $$(tid('approval-record')).length").await, 1);
        assert!(!dir.path().join("workspace").join("hi.txt").exists());
        drop(restarted);
    })
    .await;
}

#[tokio::test]
async fn session_titles_show_can_be_edited_and_event_counts_stay_live() {
    let mock = MockLlm::start(Script::sequence(vec![Reply::text(&["Hello."])])).await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    let url = app.url("/");
    in_browser("session_titles_show_can_be_edited_and_event_counts_stay_live", async |b| {
        b.goto(&url).await;
        let session = b.live_session().await;
        b.fill("[data-testid=composer-input]", "Draft the release notes").await;
        b.click("[data-testid=send]").await;
        b.wait("the end of the turn", "document.querySelector('[data-testid=turn][data-state=completed]')").await;

        // The list's event count is the session's last seq, as soon as the turn is over.
        let events = app
            .get_json(&format!("/api/sessions/{session}/events?after_seq=0"), None)
            .await;
        let last_seq = events["events"].as_array().unwrap().last().unwrap()["seq"].as_i64().unwrap();
        let item = format!(r#"[data-testid=session-item][data-session-id="{session}"]"#);
        let count = |seq: i64| {
            format!("document.querySelector('{item} [data-testid=session-meta]')?.dataset.lastSeq === '{seq}' && document.querySelector('{item} [data-testid=session-meta]').textContent.endsWith(' {seq} events')")
        };
        b.wait("the event count after the turn", &count(last_seq)).await;
        // Calls outside a turn end no turn, and the list is not read again: the count
        // follows the notifications themselves.
        let mut ws = app.ws().await;
        ws.invoke(&session, "list_dir", json!({"path": "."})).await;
        ws.invoke(&session, "list_dir", json!({"path": "."})).await;
        let events = app
            .get_json(&format!("/api/sessions/{session}/events?after_seq={last_seq}"), None)
            .await;
        let now = events["events"].as_array().unwrap().last().unwrap()["seq"].as_i64().unwrap();
        assert!(now >= last_seq + 4, "{events}");
        b.wait("the event count after two calls", &count(now)).await;

        // The server titled the session from its first message; the list and the heading say it.
        let listed = app.get_json("/api/sessions", None).await;
        let title = listed["sessions"][0]["title"].clone();
        assert!(title.as_str().is_some_and(|t| !t.is_empty()), "{listed}");
        b.wait(
            "the title shown",
            &format!("document.querySelector('{item} [data-testid=session-item-title]').textContent === {title} && document.querySelector(tid('session-title')).textContent === {title}"),
        )
        .await;

        // A click makes the title editable; Enter saves it with session/update.
        b.click("[data-testid=session-title]").await;
        b.wait("the title field", "document.activeElement.dataset.testid === 'session-title-input'").await;
        b.js("document.querySelector(tid('session-title-input')).value = ''").await;
        let field = b.find("[data-testid=session-title-input]").await;
        field
            .send_keys(&format!("Release notes, v2{}", fantoccini::key::Key::Enter))
            .await
            .unwrap();
        b.wait(
            "the new title",
            &format!("!document.querySelector(tid('session-title')).hidden && document.querySelector(tid('session-title')).textContent === 'Release notes, v2' && document.querySelector('{item} [data-testid=session-item-title]').textContent === 'Release notes, v2'"),
        )
        .await;
        let row = app.get_json(&format!("/api/sessions/{session}"), None).await;
        assert_eq!(row["title"], "Release notes, v2", "{row}");

        // Escape leaves it as it was.
        b.click("[data-testid=session-title]").await;
        b.wait("the title field", "document.activeElement.dataset.testid === 'session-title-input'").await;
        let field = b.find("[data-testid=session-title-input]").await;
        field
            .send_keys(&format!("nope{}", fantoccini::key::Key::Escape))
            .await
            .unwrap();
        b.wait(
            "the title unchanged",
            "!document.querySelector(tid('session-title')).hidden && document.querySelector(tid('session-title')).textContent === 'Release notes, v2'",
        )
        .await;

        b.client.refresh().await.unwrap();
        b.live_session().await;
        b.wait(
            "the title after a reload",
            "document.querySelector(tid('session-title')).textContent === 'Release notes, v2'",
        )
        .await;
    })
    .await;
}

#[tokio::test]
async fn a_fork_is_marked_links_to_its_parent_and_shows_what_it_inherited() {
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::text(&["First answer."]).with_usage(1000, 40),
        Reply::text(&["Second answer."]).with_usage(3000, 80),
        Reply::text(&["An answer in the fork."]).with_usage(2000, 10),
    ]))
    .await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    let url = app.url("/");
    in_browser("a_fork_is_marked_links_to_its_parent_and_shows_what_it_inherited", async |b| {
        b.goto(&url).await;
        let source = b.live_session().await;
        for (n, text) in ["First question", "Second question"].into_iter().enumerate() {
            b.fill("[data-testid=composer-input]", text).await;
            b.click("[data-testid=send]").await;
            b.wait(
                "the end of the turn",
                &format!("$$('[data-testid=turn][data-state=completed] [data-testid=fork-turn]').length === {}", n + 1),
            )
            .await;
        }
        let first_turn_usd = b
            .js("return Number(document.querySelector(tid('turn-cost')).dataset.usd)")
            .await
            .as_f64()
            .unwrap();
        assert!(first_turn_usd > 0.0);
        b.click("[data-testid=turn] [data-testid=fork-turn]").await;
        let fork = b
            .wait(
                "the fork",
                &format!(
                    "(() => {{ const id = new URL(location.href).searchParams.get('session');
                       return id && id !== '{source}' && document.querySelector(tid('connection-status')).dataset.status === 'live'
                         && $$('[data-testid=turn][data-state=completed]').length === 1 && id; }})()"
                ),
            )
            .await;
        let fork = fork.as_str().unwrap().to_string();

        // In the list, the fork is marked and links to its parent; the heading says it too.
        let item = format!(r#"[data-testid=session-item][data-session-id="{fork}"]"#);
        let marked = b
            .wait(
                "the fork in the list",
                &format!("document.querySelector('{item} [data-testid=session-fork-mark]') && document.querySelector('{item}').parentElement.querySelector(tid('session-parent-link'))?.dataset.parentId"),
            )
            .await;
        assert_eq!(marked, source.as_str());
        assert_eq!(
            b.js(&format!(r#"return $$('[data-testid=session-item][data-session-id="{source}"] [data-testid=session-fork-mark]').length"#)).await,
            0,
            "the parent is no fork"
        );
        b.wait(
            "the heading's parent link",
            &format!("!document.querySelector(tid('session-fork-of')).hidden && document.querySelector(tid('session-parent'))?.dataset.parentId === '{source}'"),
        )
        .await;

        // The cost panel: nothing spent here yet, and what the parent had spent up to the fork.
        let ledger = app.get_json(&format!("/api/sessions/{fork}/cost"), None).await;
        let inherited = ledger["inherited_usd"].as_f64().unwrap_or_else(|| panic!("{ledger}"));
        assert!((inherited - first_turn_usd).abs() < 1e-12, "{inherited} vs {first_turn_usd}");
        let panel = "!document.querySelector(tid('cost-inherited-row')).hidden && [Number(document.querySelector(tid('cost-total')).dataset.usd), Number(document.querySelector(tid('cost-inherited')).dataset.usd), document.querySelector(tid('cost-total-label')).textContent]";
        let shown = b.wait("the inherited cost", panel).await;
        assert_eq!(shown[0], 0.0, "{shown}");
        assert!((shown[1].as_f64().unwrap() - inherited).abs() < 1e-12, "{shown}");
        assert_eq!(shown[2], "Spent here");

        // The fork's own turn counts in its own spend; what it inherited stays apart.
        b.fill("[data-testid=composer-input]", "Go on from here").await;
        b.click("[data-testid=send]").await;
        b.wait("the fork's own turn", "$$('[data-testid=turn][data-state=completed]').length === 2").await;
        let own = session_cost(&app, &fork).await;
        assert!(own > 0.0);
        b.wait(
            "the fork's own spend",
            &format!("Math.abs(Number(document.querySelector(tid('cost-total')).dataset.usd) - {own}) < 1e-12 && Math.abs(Number(document.querySelector(tid('cost-inherited')).dataset.usd) - {inherited}) < 1e-12"),
        )
        .await;

        // The parent link leads back to the source, which inherited nothing.
        b.click("[data-testid=session-parent]").await;
        b.wait(
            "the source",
            &format!("new URL(location.href).searchParams.get('session') === '{source}' && $$('[data-testid=turn][data-state=completed]').length === 2 && document.querySelector(tid('cost-inherited-row')).hidden && document.querySelector(tid('cost-total-label')).textContent === 'Session total'"),
        )
        .await;
    })
    .await;
}

/// An OpenAI-style stream that first reasons in `reasoning` chunks (as `reasoning_content`,
/// the way DeepSeek streams it), then sends the deltas `then`, then ends with `finish`.
fn reasoning_then(reasoning: &[&str], then: &[Value], finish: &str) -> Reply {
    let chunk = |delta: &Value| {
        format!(
            "data: {}\n\n",
            json!({"choices": [{"index": 0, "delta": delta}]})
        )
    };
    let mut body = chunk(&json!({"role": "assistant", "content": null}));
    for piece in reasoning {
        body += &chunk(&json!({"reasoning_content": piece}));
    }
    for delta in then {
        body += &chunk(delta);
    }
    body += &format!(
        "data: {}\n\ndata: [DONE]\n\n",
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
               "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}})
    );
    Reply::raw_sse(&body)
}

/// What each turn on the page holds, in order: the `data-testid` of every child.
const TURN_LAYOUT: &str =
    "$$(tid('turn')).map((turn) => Array.from(turn.children, (child) => child.dataset.testid))";

/// Each reasoning block: `[open, summary, text, still streaming]`.
const REASONING_BLOCKS: &str = "$$(tid('reasoning')).map((r) => [r.open, r.querySelector('summary').textContent, r.querySelector(tid('reasoning-text')).textContent, r.dataset.streaming])";

#[tokio::test]
async fn reasoning_shows_folded_before_each_steps_answer_live_after_a_reconnect_and_a_reload() {
    let listing = json!({"tool_calls": [{"index": 0, "id": "call_look", "type": "function",
        "function": {"name": "list_dir", "arguments": "{\"path\":\".\"}"}}]});
    let mock = MockLlm::start(Script::sequence(vec![
        reasoning_then(&["Looking at ", "the files."], &[listing], "tool_calls"),
        reasoning_then(
            &["Now I can answer."],
            &[json!({"content": "One file."})],
            "stop",
        ),
        reasoning_then(
            &["Still ", "one."],
            &[json!({"content": "Still one file."})],
            "stop",
        ),
    ]))
    .await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    std::fs::create_dir_all(app.workspace()).unwrap();
    std::fs::write(app.workspace().join("notes.txt"), "remember\n").unwrap();
    let url = app.url("/");
    in_browser(
        "reasoning_shows_folded_before_each_steps_answer_live_after_a_reconnect_and_a_reload",
        async |b| {
            b.goto(&url).await;
            let session = b.live_session().await;
            b.fill("[data-testid=composer-input]", "What is in here?").await;
            b.click("[data-testid=send]").await;
            b.wait("the end of the turn", "document.querySelector('[data-testid=turn][data-state=completed]')").await;

            // Each step's reasoning comes first in it, folded, with its size; its deltas
            // make one block, and none of it leaks into the answer.
            let first_turn = json!([
                "user-message", "reasoning", "tool-card", "reasoning", "assistant-message", "turn-footer"
            ]);
            assert_eq!(b.js(&format!("return {TURN_LAYOUT}")).await, json!([first_turn]));
            let first_blocks = json!([
                [false, "Reasoning · 21 characters", "Looking at the files.", "false"],
                [false, "Reasoning · 17 characters", "Now I can answer.", "false"]
            ]);
            assert_eq!(b.js(&format!("return {REASONING_BLOCKS}")).await, first_blocks);
            assert_eq!(
                b.js("return texts(tid('assistant-message'))").await,
                json!(["One file."])
            );
            // Opened, it shows its text.
            b.click("[data-testid=reasoning] summary").await;
            assert_eq!(
                b.js("return document.querySelector(tid('reasoning-text')).checkVisibility()").await,
                true
            );

            // A turn while the page is away reaches it on the reconnect, drawn the same way.
            b.js("window.agentd.connection.dropForTest({ hold: true })").await;
            b.wait(
                "the lost connection",
                "document.querySelector(tid('connection-status')).dataset.status === 'reconnecting'",
            )
            .await;
            let mut ws = app.ws().await;
            ws.result(
                "turn/start",
                json!({"session_id": session, "input": [{"kind": "text", "text": "And now?"}]}),
            )
            .await;
            ws.notification("turn/completed").await;
            b.js("window.agentd.connection.resumeForTest()").await;
            b.live_session().await;
            let second_turn = json!(["user-message", "reasoning", "assistant-message", "turn-footer"]);
            let layout = b
                .wait(
                    "the missed turn",
                    &format!("$$('[data-testid=turn][data-state=completed]').length === 2 && {TURN_LAYOUT}"),
                )
                .await;
            assert_eq!(layout, json!([first_turn, second_turn]));
            let missed_block = json!([false, "Reasoning · 10 characters", "Still one.", "false"]);
            let blocks = b.js(&format!("return {REASONING_BLOCKS}")).await;
            assert_eq!(blocks[2], missed_block, "{blocks}");
            assert_eq!(b.js("return window.agentd.state.repeated").await, 0);

            // A reload replays the whole history: the same blocks, folded again.
            b.client.refresh().await.unwrap();
            assert_eq!(b.live_session().await, session);
            let layout = b
                .wait(
                    "the history",
                    &format!("$$('[data-testid=turn][data-state=completed]').length === 2 && {TURN_LAYOUT}"),
                )
                .await;
            assert_eq!(layout, json!([first_turn, second_turn]));
            let mut all_blocks = first_blocks.as_array().unwrap().clone();
            all_blocks.push(missed_block);
            assert_eq!(b.js(&format!("return {REASONING_BLOCKS}")).await, json!(all_blocks));
        },
    )
    .await;
}

/// A provider `mock` serving three models: `m-large` (the default, priced, takes images),
/// `m-small` (unpriced) and `m-blind` (takes no images).
fn three_models(mock: &MockLlm) -> impl FnOnce(&mut Config) + use<> {
    let provider = ProviderConfig {
        name: "mock".into(),
        kind: agentd::llm::ProviderKind::OpenAiChat,
        base_url: mock.base_url(),
        api_key_env: None,
        models: vec!["m-large".into(), "m-small".into(), "m-blind".into()],
        api_key: None,
    };
    move |c: &mut Config| {
        c.llm.model = Some("mock/m-large".into());
        c.llm.providers = vec![provider];
        c.llm.pricing.insert(
            "mock/m-large".into(),
            ModelCard {
                images: Some(true),
                ..ModelCard::priced(ModelPrice::new(3.0, 15.0))
            },
        );
        c.llm.pricing.insert(
            "mock/m-blind".into(),
            ModelCard {
                images: Some(false),
                ..ModelCard::default()
            },
        );
    }
}

/// The values of a select's options.
fn options_of(select: &str) -> String {
    format!("$$(tid('{select}') + ' option').map((o) => o.value)")
}

#[tokio::test]
async fn models_are_picked_per_session_and_per_turn_and_their_cost_is_shown_per_model() {
    let mock = MockLlm::start(Script::always(Reply::text(&["ok"]).with_usage(1000, 10))).await;
    let app = TestApp::spawn_with(three_models(&mock)).await;
    let url = app.url("/");
    in_browser(
        "models_are_picked_per_session_and_per_turn_and_their_cost_is_shown_per_model",
        async |b| {
            b.goto(&url).await;
            let session = b.live_session().await;
            let mut ws = app.ws().await;
            let listed = ws.result("model/list", json!({})).await;
            let ids: Vec<Value> = listed["models"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["id"].clone())
                .collect();
            assert_eq!(ids, ["mock/m-large", "mock/m-small", "mock/m-blind"]);

            // The session's picker offers what model/list offers, unpriced ones said so.
            let picker = b
                .wait(
                    "the session's model picker",
                    "!document.querySelector(tid('session-model-picker')).hidden && [document.querySelector(tid('session-model')).value, texts(tid('session-model') + ' option')]",
                )
                .await;
            assert_eq!(
                picker,
                json!(["mock/m-large", ["mock/m-large (default)", "mock/m-small (unpriced)", "mock/m-blind (unpriced)"]])
            );
            assert_eq!(b.js(&format!("return {}", options_of("session-model"))).await, json!(ids));
            let mut turn_models = vec![json!("")];
            turn_models.extend(ids.iter().cloned());
            assert_eq!(b.js(&format!("return {}", options_of("turn-model"))).await, json!(turn_models));
            let efforts = json!(["", "none", "minimal", "low", "medium", "high", "xhigh"]);
            assert_eq!(b.js(&format!("return {}", options_of("turn-effort"))).await, efforts);
            assert_eq!(b.js(&format!("return {}", options_of("session-effort"))).await, efforts);
            assert_eq!(b.js("return document.querySelector(tid('turn-effort')).value").await, "");

            // The session's choice is stored by the server and reaches the model.
            b.find("[data-testid=session-model]").await.select_by_value("mock/m-small").await.unwrap();
            b.wait(
                "the session on m-small",
                "!document.querySelector(tid('session-model')).disabled && document.querySelector(tid('session-model')).value === 'mock/m-small'",
            )
            .await;
            b.find("[data-testid=session-effort]").await.select_by_value("low").await.unwrap();
            b.wait(
                "the session's effort",
                "!document.querySelector(tid('session-effort')).disabled && document.querySelector(tid('session-effort')).value === 'low'",
            )
            .await;
            let opened = ws.result("session/open", json!({"session_id": session})).await;
            assert_eq!((&opened["model"], &opened["reasoning_effort"]), (&json!("mock/m-small"), &json!("low")));
            let send = async |text: &str, turns: usize| {
                b.fill("[data-testid=composer-input]", text).await;
                b.click("[data-testid=send]").await;
                b.wait(
                    "the end of the turn",
                    &format!("$$('[data-testid=turn][data-state=completed]').length === {turns}"),
                )
                .await;
            };
            send("first", 1).await;
            let asked = |n: usize| {
                let request = &mock.requests()[n];
                (request["model"].clone(), request["reasoning_effort"].clone())
            };
            assert_eq!(asked(0), (json!("m-small"), json!("low")));

            // One turn may use another model and effort; the choice is for that turn only.
            b.find("[data-testid=turn-model]").await.select_by_value("mock/m-large").await.unwrap();
            b.find("[data-testid=turn-effort]").await.select_by_value("high").await.unwrap();
            send("second", 2).await;
            assert_eq!(asked(1), (json!("m-large"), json!("high")));
            assert_eq!(
                b.js("return [document.querySelector(tid('turn-model')).value, document.querySelector(tid('turn-effort')).value]").await,
                json!(["", ""])
            );
            send("third", 3).await;
            assert_eq!(asked(2), (json!("m-small"), json!("low")));

            // The cost per model, from the ledger: the unpriced model says so rather than $0.
            let ledger = app.get_json(&format!("/api/sessions/{session}/cost"), None).await;
            let large_usd: f64 = ledger["rows"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["model"] == "mock/m-large")
                .map(|r| r["actual_usd"].as_f64().unwrap())
                .sum();
            assert!(large_usd > 0.0, "{ledger}");
            let rows = b
                .wait(
                    "a cost row per model, with every call",
                    "$$(tid('cost-model-row')).reduce((calls, r) => calls + Number(r.dataset.calls), 0) === 3 && $$(tid('cost-model-row')).map((r) => [r.dataset.model, r.dataset.calls, r.dataset.priced, r.lastElementChild.textContent, Number(r.dataset.usd)])",
                )
                .await;
            let row = |n: usize| rows[n].as_array().unwrap().clone();
            assert_eq!(row(0)[..4], [json!("mock/m-small"), json!("2"), json!("false"), json!("unpriced")], "{rows}");
            assert_eq!(row(0)[4].as_f64(), Some(0.0), "{rows}");
            assert_eq!(row(1)[..4], [json!("mock/m-large"), json!("1"), json!("true"), json!(format!("${large_usd:.6}"))], "{rows}");
            assert!((row(1)[4].as_f64().unwrap() - large_usd).abs() < 1e-12, "{rows}");

            // A reload shows the session's stored choice.
            b.client.refresh().await.unwrap();
            assert_eq!(b.live_session().await, session);
            b.wait(
                "the stored choice",
                "!document.querySelector(tid('session-model-picker')).hidden && document.querySelector(tid('session-model')).value === 'mock/m-small' && document.querySelector(tid('session-effort')).value === 'low'",
            )
            .await;
        },
    )
    .await;
}

/// A 1×1 PNG and a 1×1 GIF, in base64.
const PNG_1X1: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
const GIF_1X1: &str = "R0lGODlhAQABAIAAAP///wAAACH5BAEAAAAALAAAAAABAAEAAAICRAEAOw==";

/// Script helpers that hand the composer files the way a person's drop or paste does.
const FILE_EVENTS: &str = r#"
const fromBase64 = (text) => Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
const transfer = (files) => { const dt = new DataTransfer(); for (const f of files) dt.items.add(f); return dt; };
const composerInput = () => document.querySelector(tid('composer-input'));
const drop = (files) => composerInput().dispatchEvent(new DragEvent('drop', { dataTransfer: transfer(files), bubbles: true, cancelable: true }));
const paste = (files) => composerInput().dispatchEvent(new ClipboardEvent('paste', { clipboardData: transfer(files), bubbles: true, cancelable: true }));
"#;

#[tokio::test]
async fn images_pasted_or_dropped_show_as_thumbnails_and_go_with_the_message() {
    let mock = MockLlm::start(Script::always(Reply::text(&["A dot."]))).await;
    let app = TestApp::spawn_with(three_models(&mock)).await;
    let url = app.url("/");
    in_browser(
        "images_pasted_or_dropped_show_as_thumbnails_and_go_with_the_message",
        async |b| {
            b.goto(&url).await;
            b.live_session().await;
            b.wait("the model list", "!document.querySelector(tid('turn-choice')).hidden").await;
            // Every frame the page sends, as sent.
            b.js("const send = WebSocket.prototype.send; window.__frames = []; WebSocket.prototype.send = function (data) { window.__frames.push(String(data)); return send.call(this, data); };").await;

            b.js(&format!(
                "{FILE_EVENTS} drop([new File([fromBase64('{PNG_1X1}')], 'dot.png', {{ type: 'image/png' }})]);
                 paste([new File([fromBase64('{GIF_1X1}')], 'dot.gif', {{ type: 'image/gif' }})]);"
            ))
            .await;
            // Thumbnails of both, decoded (the page's policy lets it show its own blob: URLs).
            let shown = b
                .wait(
                    "two thumbnails",
                    "$$(tid('attachment')).length === 2 && $$(tid('attachment') + ' img').every((i) => i.complete && i.naturalWidth === 1) && $$(tid('attachment')).map((a) => `${a.dataset.name}:${a.dataset.mime}`)",
                )
                .await;
            assert_eq!(shown, json!(["dot.png:image/png", "dot.gif:image/gif"]));
            assert_eq!(b.js("return document.querySelector(tid('attach-refused')).hidden").await, true);

            // Other files and too large images are refused, visibly, and not attached.
            b.js(&format!(
                "{FILE_EVENTS} drop([new File(['just text'], 'notes.txt', {{ type: 'text/plain' }})]);"
            ))
            .await;
            let refused = b
                .wait(
                    "the refusal of a text file",
                    "!document.querySelector(tid('attach-refused')).hidden && document.querySelector(tid('attach-refused')).textContent",
                )
                .await;
            assert_eq!(refused, "Not attached: notes.txt is not a PNG, JPEG, GIF or WebP image.");
            b.js(&format!(
                "{FILE_EVENTS} paste([new File([new Uint8Array(5 * 1024 * 1024 + 1)], 'huge.png', {{ type: 'image/png' }})]);"
            ))
            .await;
            b.wait(
                "the refusal of a large image",
                "document.querySelector(tid('attach-refused')).textContent.startsWith('Not attached: huge.png is larger than the 5 MiB an image may be')",
            )
            .await;
            assert_eq!(b.js("return $$(tid('attachment')).length").await, 2);

            // The remove button takes one away.
            b.click("[data-testid=attachment][data-name='dot.gif'] [data-testid=attachment-remove]").await;
            b.wait("one thumbnail", "$$(tid('attachment')).length === 1").await;

            // A model that takes no images is said to, before anything is sent; sent anyway,
            // the server refuses the message, and the page keeps its text and image.
            b.find("[data-testid=session-model]").await.select_by_value("mock/m-blind").await.unwrap();
            let warning = b
                .wait(
                    "the warning",
                    "!document.querySelector(tid('image-warning')).hidden && document.querySelector(tid('image-warning')).dataset.model",
                )
                .await;
            assert_eq!(warning, "mock/m-blind");
            b.fill("[data-testid=composer-input]", "What is this?").await;
            b.click("[data-testid=send]").await;
            b.wait(
                "the refusal",
                "texts(tid('conversation-notice')).some((t) => t.startsWith('The message was not sent') && t.includes('takes no image input'))",
            )
            .await;
            assert_eq!(
                b.js("return [document.querySelector(tid('composer-input')).value, $$(tid('attachment')).length, $$(tid('turn')).length]").await,
                json!(["What is this?", 1, 0])
            );
            assert_eq!(mock.request_count(), 0);

            // This message uses a model that takes images: the warning goes, and the image
            // goes after the text, in base64 as it was read.
            b.find("[data-testid=turn-model]").await.select_by_value("mock/m-large").await.unwrap();
            b.wait("no warning", "document.querySelector(tid('image-warning')).hidden").await;
            b.js("window.__frames = []").await;
            b.click("[data-testid=send]").await;
            let sent = b
                .wait(
                    "the turn/start frame",
                    "window.__frames.map((f) => JSON.parse(f)).find((m) => m.method === 'turn/start')?.params",
                )
                .await;
            assert_eq!(
                sent["input"],
                json!([
                    {"kind": "text", "text": "What is this?"},
                    {"kind": "image", "mime": "image/png", "data": PNG_1X1}
                ])
            );
            assert_eq!(sent["model"], "mock/m-large");
            assert!(sent.get("reasoning_effort").is_none(), "{sent}");

            // The turn shows the image beside the text; the composer is empty again.
            b.wait("the end of the turn", "document.querySelector('[data-testid=turn][data-state=completed]')").await;
            b.wait(
                "the image in the turn",
                "$$(tid('turn') + ' ' + tid('user-image')).map((i) => i.naturalWidth).join() === '1'",
            )
            .await;
            assert_eq!(
                b.js("return [$$(tid('attachment')).length, document.querySelector(tid('attachments')).hidden, document.querySelector(tid('composer-input')).value]").await,
                json!([0, true, ""])
            );
            let request = mock.requests()[0].to_string();
            assert!(request.contains(PNG_1X1), "the image reaches the model: {request}");
        },
    )
    .await;
}

/// A script function: the files listed by the rows `selector` finds, as "path:change".
const ROWS: &str =
    "(selector) => $$(selector).map((row) => `${row.dataset.path}:${row.dataset.change}`)";

#[tokio::test]
async fn a_turn_diff_shows_per_file_and_reverts_after_a_preview() {
    let mock = MockLlm::start(Script::sequence(vec![
        Reply::tool_calls(vec![ScriptedCall::whole(
            "c1",
            "shell",
            &json!({"command": "echo made > made.txt && sed -i 's/one/ONE/' edit.txt"}),
        )]),
        Reply::text(&["changed"]),
    ]))
    .await;
    let app = TestApp::spawn_with(with_model(&mock)).await;
    let root = app.workspace();
    std::fs::write(root.join("edit.txt"), "one\ntwo\n").unwrap();
    let url = app.url("/");
    in_browser("a_turn_diff_shows_per_file_and_reverts_after_a_preview", async |b| {
        b.goto(&url).await;
        let session = b.live_session().await;
        b.fill("[data-testid=composer-input]", "Change the files").await;
        b.click("[data-testid=send]").await;

        // The turn lists what it changed, each file with its change.
        let files = b
            .wait(
                "the changed files",
                &format!(
                    "$$(tid('turn-diff-file')).length === 2 && ({ROWS})('[data-testid=turn] [data-testid=turn-diff] [data-testid=turn-diff-file]')"
                ),
            )
            .await;
        assert_eq!(files, json!(["edit.txt:modified", "made.txt:added"]));
        let badges = b.js("return texts('[data-testid=turn-diff-file] [data-testid=change-badge]')").await;
        assert_eq!(badges, json!(["modified", "added"]));

        // A click shows that file's part of the diff, added and removed lines marked.
        b.click("[data-testid=turn-diff-file][data-path='edit.txt'] button").await;
        let shown = b
            .wait(
                "edit.txt's diff",
                "document.querySelector('[data-testid=turn-diff-view][data-path=\"edit.txt\"]')?.textContent",
            )
            .await;
        let shown = shown.as_str().unwrap();
        assert!(shown.contains("\n-one\n+ONE\n") && !shown.contains("made"), "{shown}");
        assert_eq!(
            b.js("return [texts('.diff-view .diff-del'), texts('.diff-view .diff-add')]").await,
            json!([["-one\n"], ["+ONE\n"]])
        );

        // Revert previews what it would do first: nothing changed since the turn ended.
        b.click("[data-testid=turn-revert]").await;
        let planned = b
            .wait(
                "the preview",
                &format!(
                    "document.querySelector(tid('revert-preview')) && [({ROWS})('[data-testid=revert-preview] [data-testid=revert-file]'), $$(tid('revert-conflicts')).length]"
                ),
            )
            .await;
        assert_eq!(planned, json!([["edit.txt:modified", "made.txt:deleted"], 0]));
        assert!(root.join("made.txt").exists(), "a preview touches nothing");
        b.click("[data-testid=revert-confirm]").await;
        let line = b
            .wait(
                "the reverted line",
                "!document.querySelector(tid('revert-preview')) && $$(tid('session-reverted')).length === 1 && document.querySelector(tid('session-reverted-text')).textContent",
            )
            .await;
        assert_eq!(line, "Workspace reverted: 2 files put back as before the turn.");
        assert!(!root.join("made.txt").exists());
        assert_eq!(std::fs::read_to_string(root.join("edit.txt")).unwrap(), "one\ntwo\n");

        // A file written by hand since: undoing the revert warns that it would be overwritten.
        std::fs::write(root.join("hand.txt"), "by hand\n").unwrap();
        b.click("[data-testid=revert-undo]").await;
        let planned = b
            .wait(
                "the undo's preview",
                &format!(
                    "document.querySelector('[data-testid=session-reverted] [data-testid=revert-preview]') && [({ROWS})(tid('revert-file')), ({ROWS})(tid('revert-conflict')), document.querySelector(tid('revert-conflicts')).textContent]"
                ),
            )
            .await;
        assert_eq!(planned[1], json!(["hand.txt:added"]), "{planned}");
        assert!(
            planned[0].as_array().unwrap().contains(&json!("made.txt:added")),
            "{planned}"
        );
        let warning = planned[2].as_str().unwrap();
        assert!(
            warning.contains("changed since the last turn ended") && warning.contains("would be overwritten"),
            "{warning}"
        );
        // Confirming goes ahead over them (the page sends force: the server refuses otherwise).
        b.click("[data-testid=session-reverted] [data-testid=revert-confirm]").await;
        let lines = b
            .wait(
                "the undo's line",
                "$$(tid('session-reverted')).length === 2 && texts(tid('session-reverted-text'))",
            )
            .await;
        assert_eq!(
            lines,
            json!([
                "Workspace reverted: 2 files put back as before the turn.",
                "Revert undone: 3 files put back as the turn left them."
            ])
        );
        assert_eq!(std::fs::read_to_string(root.join("edit.txt")).unwrap(), "ONE\ntwo\n");
        assert!(root.join("made.txt").exists() && !root.join("hand.txt").exists());

        // A reconnect replays nothing twice; a reload shows the block and each line once.
        b.js("window.agentd.connection.dropForTest()").await;
        b.wait(
            "the reconnect",
            "window.agentd.connection.statusLog.filter((s) => s === 'live').length === 2 && window.agentd.connection.status === 'live'",
        )
        .await;
        assert_eq!(
            b.js("return [$$(tid('turn-diff')).length, $$(tid('session-reverted')).length, window.agentd.state.repeated]").await,
            json!([1, 2, 0])
        );
        b.client.refresh().await.unwrap();
        assert_eq!(b.live_session().await, session);
        let history = b
            .wait(
                "the history",
                "$$('[data-testid=turn][data-state=completed]').length === 1 && $$(tid('session-reverted')).length >= 2 && [$$(tid('turn-diff')).length, ($$('[data-testid=turn] [data-testid=turn-diff-file]').length), $$(tid('session-reverted')).map((line) => line.dataset.revertId)]",
            )
            .await;
        assert_eq!(history[0], 1, "{history}");
        assert_eq!(history[1], 2, "{history}");
        let ids = history[2].as_array().unwrap();
        assert_eq!(ids.len(), 2, "{history}");
        assert_ne!(ids[0], ids[1], "{history}");
        assert_eq!(
            b.js("return texts(tid('session-reverted-text'))").await,
            lines
        );
    })
    .await;
}
