//! The small status page at `/`: the caller's pipelines with live figures,
//! refreshed every two seconds.

use crate::types::PipelineStatus;

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn table(pipelines: &[PipelineStatus]) -> String {
    if pipelines.is_empty() {
        return "<p>No pipelines.</p>".into();
    }
    let mut rows = String::new();
    for p in pipelines {
        rows.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td class=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&p.name),
            escape(&p.component),
            p.state.as_str(),
            p.state.as_str(),
            p.workers,
            p.steps,
            p.events_in,
            p.events_out,
            p.input_lag,
            p.last_checkpoint.map_or("–".into(), |s| s.to_string()),
            p.last_error.as_deref().map(escape).unwrap_or_default(),
        ));
    }
    format!(
        "<table><tr><th>pipeline</th><th>component</th><th>state</th><th>W</th><th>steps</th>\
         <th>events in</th><th>events out</th><th>input lag</th><th>checkpoint</th><th>last error</th></tr>{rows}</table>"
    )
}

fn doc(body: &str) -> String {
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"2\">\
         <title>Sluice</title><style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}\
         td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left}}.failed{{color:#b00}}\
         .running{{color:#070}}</style></head><body><h1>Sluice</h1>\
         <form method=\"post\" action=\"/logout\"><button type=\"submit\">Sign out</button></form>\
         {body}</body></html>"
    )
}

/// One tenant's page.
pub fn render(tenant: &str, pipelines: &[PipelineStatus]) -> String {
    doc(&format!("<h2>{}</h2>{}", escape(tenant), table(pipelines)))
}

/// The admin's page: every tenant.
pub fn render_all(tenants: &[(String, Vec<PipelineStatus>)]) -> String {
    let body: String = tenants
        .iter()
        .map(|(t, p)| format!("<h2>{}</h2>{}", escape(t), table(p)))
        .collect();
    doc(&body)
}

/// The sign-in form (with what went wrong, if a sign-in failed). The
/// token goes in a form body, never in the URL.
pub fn login(error: Option<&str>) -> String {
    let error = error.map_or(String::new(), |e| {
        format!("<p class=\"failed\">{}</p>", escape(e))
    });
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Sluice</title>\
         <style>body{{font-family:sans-serif;margin:2em}}.failed{{color:#b00}}</style></head>\
         <body><h1>Sluice</h1>{error}<form method=\"post\" action=\"/login\">\
         <label>Token <input type=\"password\" name=\"token\" autocomplete=\"current-password\" \
         required></label> <button type=\"submit\">Sign in</button></form></body></html>"
    )
}
