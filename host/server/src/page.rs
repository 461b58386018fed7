//! The console's pages: the sign-in form and the console's shell, which
//! holds a server-rendered first view (readable without scripts) that
//! `assets/console.js` replaces with live views over the API. The assets
//! are compiled in: serving the console needs no files and no Node.js.

use crate::types::PipelineStatus;

/// `assets/console.js`.
pub const CONSOLE_JS: &str = include_str!("../assets/console.js");
/// `assets/console.css`.
pub const CONSOLE_CSS: &str = include_str!("../assets/console.css");
/// uPlot 1.6.32 (MIT), vendored: `assets/vendor/uplot`.
pub const UPLOT_JS: &str = include_str!("../assets/vendor/uplot/uPlot.iife.min.js");
/// uPlot's stylesheet.
pub const UPLOT_CSS: &str = include_str!("../assets/vendor/uplot/uPlot.min.css");

/// Text for HTML: `&`, `<`, `>`, `"` and `'` escaped.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

fn table(pipelines: &[PipelineStatus]) -> String {
    if pipelines.is_empty() {
        return "<p>No pipelines.</p>".into();
    }
    let mut rows = String::new();
    for p in pipelines {
        rows.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td class=\"state {}\">{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td class=\"err\">{}</td></tr>",
            escape(&p.name),
            escape(&p.component),
            p.state.as_str(),
            p.state.as_str(),
            p.workers,
            p.steps,
            p.events_in,
            p.events_out,
            p.input_lag,
            p.last_error.as_deref().map(escape).unwrap_or_default(),
        ));
    }
    format!(
        "<table><tr><th>pipeline</th><th>component</th><th>state</th><th>W</th><th>steps</th>\
         <th>events in</th><th>events out</th><th>input lag</th><th>last error</th></tr>{rows}</table>"
    )
}

fn shell(who: &str, admin: bool, first_view: &str) -> String {
    let who_json = serde_json::json!({ "name": who, "admin": admin })
        .to_string()
        .replace('<', "\\u003c");
    let nav = if admin {
        "<a href=\"#/admin\">Host</a>"
    } else {
        "<a href=\"#/\">Pipelines</a>"
    };
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>Sluice</title><link rel=\"icon\" href=\"data:,\"><link rel=\"stylesheet\" href=\"/assets/uplot.css\">\
         <link rel=\"stylesheet\" href=\"/assets/console.css\"></head><body>\
         <header><h1>Sluice</h1><nav>{nav}</nav><span class=\"who\">{}{}</span>\
         <form method=\"post\" action=\"/logout\"><button type=\"submit\">Sign out</button></form></header>\
         <main id=\"app\">{first_view}</main>\
         <script type=\"application/json\" id=\"who\">{who_json}</script>\
         <script src=\"/assets/uplot.js\"></script><script src=\"/assets/console.js\"></script>\
         </body></html>",
        if admin { "admin" } else { "tenant " },
        if admin { String::new() } else { escape(who) },
    )
}

/// One tenant's console, its first view listing the pipelines.
pub fn render(tenant: &str, pipelines: &[PipelineStatus]) -> String {
    shell(
        tenant,
        false,
        &format!(
            "<h2>Pipelines</h2><div class=\"card\">{}</div>",
            table(pipelines)
        ),
    )
}

/// The admin's console, its first view listing every tenant's pipelines.
pub fn render_all(tenants: &[(String, Vec<PipelineStatus>)]) -> String {
    let body: String = tenants
        .iter()
        .map(|(t, p)| {
            format!(
                "<h2>{}</h2><div class=\"card\">{}</div>",
                escape(t),
                table(p)
            )
        })
        .collect();
    shell("admin", true, &body)
}

/// The sign-in form (with what went wrong, if a sign-in failed). The
/// token goes in a form body, never in the URL.
pub fn login(error: Option<&str>) -> String {
    let error = error.map_or(String::new(), |e| {
        format!("<p class=\"message error\">{}</p>", escape(e))
    });
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Sluice</title><link rel=\"icon\" href=\"data:,\">\
         <link rel=\"stylesheet\" href=\"/assets/console.css\"></head>\
         <body><header><h1>Sluice</h1></header><main><div class=\"card\" style=\"max-width:32em\">\
         <h2>Sign in</h2>{error}<form method=\"post\" action=\"/login\" class=\"inline\">\
         <label>Token <input type=\"password\" name=\"token\" autocomplete=\"current-password\" \
         required size=\"40\"></label> <button class=\"primary\" type=\"submit\">Sign in</button></form>\
         <p class=\"muted\">Your tenant token, or the admin token. It is sent once; the browser \
         keeps a session cookie.</p></div></main></body></html>"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shell_escapes_what_it_shows() {
        let page = shell("a<b", false, "");
        assert!(page.contains("tenant a&lt;b"));
        assert!(!page.contains("\"a<b\""), "the JSON island escapes < too");
        assert!(login(Some("<script>")).contains("&lt;script&gt;"));
    }
}
