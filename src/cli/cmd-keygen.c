/* `hearth keygen`: a new cluster key (issue 29), never overwriting one */
#include "cli.h"

#include "net/net.h"

#include <libgen.h>
#include <stdio.h>

static int keygen(cli_opts *o) {
    char def[4096], dir[4096];
    hr_err err = {0};
    const char *path = o->output;
    if (!path) {
        if (hn_key_default_path(def, sizeof def, &err)) { fprintf(stderr, "hearth keygen: %s (give -o FILE)\n", err.msg); return 1; }
        path = def;
        /* the default place's directory is made (private); a directory given with -o must exist */
        snprintf(dir, sizeof dir, "%s", def);
        if (hr_mkdirs(dirname(dir), 0700, &err)) { fprintf(stderr, "hearth keygen: %s\n", err.msg); return 1; }
    }
    hn_key k;
    if (hn_key_generate(path, &k, &err)) { fprintf(stderr, "hearth keygen: %s\n", err.msg); return 1; }
    char id[2 * HN_KEY_ID_SIZE + 1];
    hn_key_id_hex(&k, id);
    hn_key_wipe(&k);
    printf("wrote a new cluster key to %s (key id %s)\n", path, id);
    printf("copy it to every device of the cluster (mode 0600) and give each --key %s\n", path);
    return 0;
}

const cli_command cli_keygen = {
    "keygen", CLI_KEYGEN, "make a cluster key (who holds it may join the cluster)", "[-o FILE]",
    "Writes 32 random bytes as one line of base64 to FILE (default $XDG_CONFIG_HOME/hearth/cluster.key,\n"
    "or ~/.config/hearth/cluster.key), created with mode 0600. An existing file is never overwritten.\n"
    "Head and workers that hold the same key authenticate each other and encrypt what they send\n"
    "(--key FILE; docs/security.md). The key id printed names the key without revealing it.",
    .run = keygen};
