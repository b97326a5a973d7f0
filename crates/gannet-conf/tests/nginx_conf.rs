//! Whole, realistic configs: a representative nginx.conf written here, and the system's
//! /etc/nginx/nginx.conf (with its includes) when there is one.

use gannet_conf::{parse_file, Directive};
use std::path::Path;

const MIME_TYPES: &str = r#"
types {
    text/html                             html htm shtml;
    text/css                              css;
    application/javascript                js;
    image/png                             png;
}
"#;

const NGINX_CONF: &str = r#"user www-data;
worker_processes auto;
pid /run/nginx.pid;

events {
    worker_connections 768;
    # multi_accept on;
}

http {
    sendfile on;
    tcp_nopush on;
    types_hash_max_size 2048;
    include mime.types;
    default_type application/octet-stream;

    log_format main '$remote_addr - $remote_user [$time_local] "$request" '
                    '$status $body_bytes_sent "$http_referer" '
                    '"$http_user_agent"';
    access_log /var/log/nginx/access.log main;

    upstream backend {
        server 127.0.0.1:8080 weight=5;
        server unix:/tmp/backend.sock backup;
        keepalive 16;
    }

    map $http_upgrade $connection_upgrade {
        default upgrade;
        ''      close;
    }

    server {
        listen 80 default_server;
        listen [::]:80 default_server;
        root /var/www/html;
        index index.html index.htm;
        server_name _;

        location / {
            try_files $uri $uri/ =404;
        }

        location ~ "^/img/\d{3}" {
            expires 30d;
            add_header Cache-Control "public, max-age=${max_age}";
        }

        location ~* \.(gif|jpg|png)$ {
            if ($request_method = "POST") { return 405; }
            rewrite ^/old/(.*)$ /new/$1 permanent;
        }

        location /api/ {
            proxy_pass http://backend;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_read_timeout 1h30m;
        }

        error_page 500 502 503 504 /50x.html;
        location = /50x.html { internal; }
    }
}
"#;

fn find<'a>(ds: &'a [Directive], name: &str) -> Vec<&'a Directive> {
    ds.iter().filter(|d| d.name == name).collect()
}

fn block(d: &Directive) -> &[Directive] {
    d.block
        .as_deref()
        .unwrap_or_else(|| panic!("{} has no block", d.name))
}

#[test]
fn representative_config() {
    let dir = std::env::temp_dir().join(format!("gannet-conf-nginx-conf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("mime.types"), MIME_TYPES).unwrap();
    std::fs::write(dir.join("nginx.conf"), NGINX_CONF).unwrap();
    let parsed = parse_file(&dir.join("nginx.conf"));
    let _ = std::fs::remove_dir_all(&dir);
    let top = parsed.unwrap();

    let names: Vec<&str> = top.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["user", "worker_processes", "pid", "events", "http"]);
    let http = block(&top[4]).to_vec();

    // The include was spliced in place, with the included file's name and lines.
    let types = find(&http, "types");
    assert_eq!(types.len(), 1);
    assert!(types[0].loc.file.ends_with("mime.types") && types[0].loc.line == 2);
    assert_eq!(block(types[0])[0].args, ["html", "htm", "shtml"]);
    let pos = |n: &str| http.iter().position(|d| d.name == n).unwrap();
    assert!(pos("tcp_nopush") < pos("types") && pos("types") < pos("default_type"));

    let log_format = find(&http, "log_format")[0];
    assert_eq!(log_format.args.len(), 4);
    assert_eq!(
        log_format.args[1],
        "$remote_addr - $remote_user [$time_local] \"$request\" "
    );

    let map = find(&http, "map")[0];
    assert_eq!(block(map)[1].name, "");
    assert_eq!(block(map)[1].args, ["close"]);

    let server = find(&http, "server")[0];
    let s = block(server);
    let listens: Vec<&Vec<String>> = find(s, "listen").into_iter().map(|d| &d.args).collect();
    assert_eq!(
        listens,
        [
            &vec!["80".to_string(), "default_server".into()],
            &vec!["[::]:80".into(), "default_server".into()]
        ]
    );
    let locs = find(s, "location");
    assert_eq!(locs.len(), 5);
    assert_eq!(block(locs[0])[0].args, ["$uri", "$uri/", "=404"]);
    assert_eq!(locs[1].args, ["~", r"^/img/\d{3}"]);
    assert_eq!(
        block(locs[1])[1].args,
        ["Cache-Control", "public, max-age=${max_age}"]
    );
    assert_eq!(locs[2].args, ["~*", r"\.(gif|jpg|png)$"]);
    let iff = &block(locs[2])[0];
    assert_eq!(
        (iff.name.as_str(), iff.args.clone()),
        (
            "if",
            vec![
                "($request_method".into(),
                "=".into(),
                "POST".into(),
                ")".into()
            ]
        )
    );
    assert_eq!(block(iff)[0].args, ["405"]);
    assert_eq!(locs[4].args, ["=", "/50x.html"]);
    assert_eq!(locs[4].loc.line, 62);
    assert_eq!(block(locs[4])[0].name, "internal");
}

#[test]
fn system_nginx_conf_parses() {
    let path = Path::new("/etc/nginx/nginx.conf");
    if !path.exists() {
        eprintln!("skipped: {} does not exist", path.display());
        return;
    }
    match parse_file(path) {
        Ok(top) => assert!(!top.is_empty(), "{} parsed to nothing", path.display()),
        Err(e) => panic!("{e}"),
    }
}
