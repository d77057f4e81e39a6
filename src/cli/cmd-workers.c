/* `hearth workers`: the workers discovery finds on the LAN (src/net/discover.c, docs/discovery.md),
   and --workers auto for the commands that take --workers: those of this cluster's key, as if typed. */
#include "cli.h"

#include "net/net.h"

#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>

int cli_key_id(const cli_opts *o, uint8_t id[HN_KEY_ID_SIZE], char *path, size_t cap, hr_err *err) {
    if (o->key_file) snprintf(path, cap, "%s", o->key_file);
    else if (hn_key_default_path(path, cap, err)) return err->code;
    hn_key k;
    if (hn_key_load(path, &k, err)) return err->code;
    hn_key_id(&k, id);
    hn_key_wipe(&k);
    return 0;
}

static void hex_id(const uint8_t id[HN_KEY_ID_SIZE], char out[2 * HN_KEY_ID_SIZE + 1]) {
    sodium_bin2hex(out, 2 * HN_KEY_ID_SIZE + 1, id, HN_KEY_ID_SIZE);
}

static hn_discover_where where(const cli_opts *o) {
    return (hn_discover_where){.group = o->discover_group, .iface = o->discover_iface};
}

/* what discovery read and did not use, when anything (stderr) */
static void print_ignored(const char *cmd, const hn_discover_stats *st) {
    uint32_t bad = st->malformed + st->oversize + st->other_version;
    if (bad)
        fprintf(stderr, "hearth %s: ignored %u discovery packets (%u malformed, %u oversize, %u of another version)\n",
                cmd, bad, st->malformed, st->oversize, st->other_version);
}

int cli_discover_workers(const cli_command *c, cli_opts *o) {
    uint8_t id[HN_KEY_ID_SIZE];
    char path[4096], hex[2 * HN_KEY_ID_SIZE + 1];
    hr_err err = {0};
    /* the key id is how a head tells its own workers from a neighbour's: no key, no auto */
    if (cli_key_id(o, id, path, sizeof path, &err)) {
        fprintf(stderr, "hearth %s: --workers auto finds the workers of this cluster's key: %s\n", c->name, err.msg);
        return 1;
    }
    hex_id(id, hex);
    hn_discovery *d = malloc(sizeof *d);
    if (!d) { fprintf(stderr, "hearth %s: out of memory\n", c->name); return 1; }
    hn_discover_where w = where(o);
    int rc = hn_discover(&w, id, (int)o->discover_ms, d, &err);
    if (rc) {
        fprintf(stderr, "hearth %s: --workers auto: %s\n", c->name, err.msg);
        free(d);
        return 1;
    }
    print_ignored(c->name, &d->st);
    const hn_found *keep[HN_DISCOVER_MAX_FOUND];
    int n = 0, other_key = 0;
    for (int i = 0; i < d->n; i++) {
        const hn_found *f = &d->w[i];
        if (!f->same_key) { other_key++; continue; }
        if (f->a.proto_version != HN_PROTO_VERSION) {
            HR_LOGW("--workers auto: %s (%s) speaks protocol version %u, this head %d: left out", f->addr, f->a.name,
                    f->a.proto_version, HN_PROTO_VERSION);
            continue;
        }
        keep[n++] = f;
    }
    if (n == 0) {
        fprintf(stderr, "hearth %s: --workers auto: no worker of this cluster's key (id %s, %s) answered on %s within "
                "%ld ms (%d answered with other keys); start workers with `hearth worker --announce` and the same "
                "key, or list them with --workers HOST:PORT,...\n", c->name, hex, path,
                w.group ? w.group : HN_DISCOVER_GROUP, o->discover_ms, other_key);
        free(d);
        return 1;
    }
    if (n > HC_MAX_DEVICES - 1) {
        HR_LOGW("--workers auto: %d workers found, a cluster takes %d: the first %d by address are used", n,
                HC_MAX_DEVICES - 1, HC_MAX_DEVICES - 1);
        n = HC_MAX_DEVICES - 1;
    }
    /* the addresses live as long as the options, as a typed list does */
    const size_t each = sizeof d->w[0].addr;
    free(o->workers_copy);
    if (!(o->workers_copy = malloc(each * (size_t)n))) {
        free(d);
        fprintf(stderr, "hearth %s: out of memory\n", c->name);
        return 1;
    }
    char list[HC_MAX_DEVICES * (HN_DISCOVER_MAX_HOST + 9 + HN_MAX_NAME + 4)] = "";
    size_t len = 0;
    o->head.n_workers = 0;
    for (int i = 0; i < n; i++) {
        char *slot = o->workers_copy + each * (size_t)i;
        const hn_found *f = keep[i];
        snprintf(slot, each, "%s", f->addr);
        o->head.workers[o->head.n_workers++] = slot;
        char name[4 * HN_MAX_NAME + 1];
        hr_escape(name, sizeof name, f->a.name, strlen(f->a.name));
        int k = snprintf(list + len, sizeof list - len, "%s%s (%s)", i ? ", " : "", slot, name);
        if (k > 0) len = HR_MIN(len + (size_t)k, sizeof list - 1);
    }
    HR_LOGI("--workers auto: %d worker%s of key id %s: %s%s", n, n == 1 ? "" : "s", hex, list,
            other_key ? " (others answered with another key)" : "");
    free(d);
    return 0;
}

/* ---- hearth workers ---------------------------------------------------------------------------------- */

static json_t *workers_json(const hn_discovery *d, const cli_opts *o, const char *hex) {
    json_t *root = json_object(), *arr = json_array(), *ign = json_object();
    json_object_set_new(root, "group", json_string(o->discover_group ? o->discover_group : HN_DISCOVER_GROUP));
    json_object_set_new(root, "window_ms", json_integer(o->discover_ms));
    json_object_set_new(root, "key_id", hex ? json_string(hex) : json_null());
    for (int i = 0; i < d->n; i++) {
        const hn_found *f = &d->w[i];
        char kid[2 * HN_KEY_ID_SIZE + 1];
        hex_id(f->a.key_id, kid);
        json_t *w = json_object();
        json_object_set_new(w, "address", json_string(f->addr));
        /* names are checked printable (no control characters) but need not be UTF-8: jansson refuses
           those, so they are given escaped */
        char name[4 * HN_MAX_NAME + 1];
        hr_escape(name, sizeof name, f->a.name, strlen(f->a.name));
        json_t *js = json_string(f->a.name);
        json_object_set_new(w, "name", js ? js : json_string(name));
        json_object_set_new(w, "threads", json_integer(f->a.n_threads));
        json_object_set_new(w, "mem_budget_bytes", json_integer((json_int_t)f->a.mem_budget));
        json_object_set_new(w, "key_id", json_string(kid));
        json_object_set_new(w, "same_key", json_boolean(f->same_key));
        json_object_set_new(w, "protocol_version", json_integer(f->a.proto_version));
        json_object_set_new(w, "compatible", json_boolean(f->a.proto_version == HN_PROTO_VERSION));
        json_array_append_new(arr, w);
    }
    json_object_set_new(root, "workers", arr);
    json_object_set_new(ign, "malformed", json_integer(d->st.malformed));
    json_object_set_new(ign, "oversize", json_integer(d->st.oversize));
    json_object_set_new(ign, "other_version", json_integer(d->st.other_version));
    json_object_set_new(root, "ignored", ign);
    return root;
}

static int workers_run(cli_opts *o) {
    uint8_t id[HN_KEY_ID_SIZE];
    char path[4096], hex[2 * HN_KEY_ID_SIZE + 1];
    hr_err err = {0};
    bool have_key = cli_key_id(o, id, path, sizeof path, &err) == 0;
    /* without a key the list is still useful (which workers are there); a --key that fails is an error */
    if (!have_key && (o->key_file || err.code != HR_ENOTFOUND)) {
        fprintf(stderr, "hearth workers: %s\n", err.msg);
        return 1;
    }
    if (have_key) hex_id(id, hex);
    hn_discovery *d = malloc(sizeof *d);
    if (!d) { fprintf(stderr, "hearth workers: out of memory\n"); return 1; }
    hn_discover_where w = where(o);
    if (hn_discover(&w, have_key ? id : NULL, (int)o->discover_ms, d, &err)) {
        fprintf(stderr, "hearth workers: %s\n", err.msg);
        free(d);
        return 1;
    }
    print_ignored("workers", &d->st);
    int rc = 0;
    if (o->json) {
        json_t *root = workers_json(d, o, have_key ? hex : NULL);
        char *s = json_dumps(root, JSON_INDENT(1));
        if (s) printf("%s\n", s);
        else rc = 1;
        free(s);
        json_decref(root);
    } else {
        printf("%d worker%s answered on %s within %ld ms%s%s%s\n", d->n, d->n == 1 ? "" : "s",
               w.group ? w.group : HN_DISCOVER_GROUP, o->discover_ms, have_key ? " (this cluster's key id " : "",
               have_key ? hex : " (no cluster key here: run `hearth keygen` or give --key)", have_key ? ")" : "");
        if (d->n) printf("%-24s %-20s %7s %11s  %s\n", "ADDRESS", "NAME", "THREADS", "MEMORY", "KEY");
        for (int i = 0; i < d->n; i++) {
            const hn_found *f = &d->w[i];
            char name[4 * HN_MAX_NAME + 1], kid[2 * HN_KEY_ID_SIZE + 1], mem[32] = "?";
            hr_escape(name, sizeof name, f->a.name, strlen(f->a.name));
            hex_id(f->a.key_id, kid);
            if (f->a.mem_budget) snprintf(mem, sizeof mem, "%.1f MiB", (double)f->a.mem_budget / (1 << 20));
            printf("%-24s %-20s %7u %11s  %s%s%s%s\n", f->addr, name, f->a.n_threads, mem,
                   f->same_key ? "this cluster" : "other ", f->same_key ? "" : kid,
                   f->a.proto_version != HN_PROTO_VERSION ? ", protocol " : "",
                   f->a.proto_version != HN_PROTO_VERSION ? "incompatible" : "");
        }
    }
    fflush(stdout);
    free(d);
    return rc;
}

const cli_command cli_workers = {
    "workers", CLI_WORKERS, "list the workers that announce themselves on the LAN", "[--json] [--discover-ms MS]",
    "Asks the LAN (UDP multicast, docs/discovery.md) which workers started with `--announce` are\n"
    "there and lists each one's address, name, threads and memory budget, and whether it holds this device's\n"
    "cluster key (--key, or the default key file; without one every worker is listed as other).\n"
    "An announcement is a hint: only the cluster key's handshake lets a head in. `--workers auto`\n"
    "(run, chat, serve, plan) uses the workers listed here as `this cluster`.",
    .run = workers_run};
