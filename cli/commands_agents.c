/* commands_agents.c — `kiln agents [ls]` and `kiln agents get NAME`: the
 * worker hosts' kiln-agents as an admin sees them (GET /v1/agents), with
 * their cores, GPUs, state and when each was last heard from. */
#include "kiln.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { COLUMNS = 8 };

/* "12s ago", "3m ago", "2h ago", "4d ago" for an RFC 3339 time; "-" when
 * absent or unreadable. */
static void format_ago(const char *rfc3339, char *buf, size_t len) {
  struct tm tm;
  memset(&tm, 0, sizeof tm);
  if (!rfc3339 || sscanf(rfc3339, "%d-%d-%dT%d:%d:%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                         &tm.tm_hour, &tm.tm_min, &tm.tm_sec) != 6) {
    snprintf(buf, len, "-");
    return;
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  double s = difftime(time(NULL), timegm(&tm));
  if (s < 0) s = 0;
  if (s < 120)
    snprintf(buf, len, "%.0fs ago", s);
  else if (s < 7200)
    snprintf(buf, len, "%.0fm ago", s / 60);
  else if (s < 172800)
    snprintf(buf, len, "%.0fh ago", s / 3600);
  else
    snprintf(buf, len, "%.0fd ago", s / 86400);
}

/* "NVIDIA H200, L4" or "-": the GPUs by name (index when unnamed). */
static void format_gpus(const json_t *gpus, char *buf, size_t len) {
  size_t used = 0, i;
  json_t *g;
  buf[0] = '\0';
  json_array_foreach(gpus, i, g) {
    const char *name = cli_string_at(g, "name");
    char unnamed[32];
    if (!name || !*name) {
      snprintf(unnamed, sizeof unnamed, "GPU %lld",
               (long long)json_integer_value(json_object_get(g, "index")));
      name = unnamed;
    }
    int n = snprintf(buf + used, len - used, "%s%s", i ? ", " : "", name);
    if (n < 0 || (size_t)n >= len - used) break;
    used += (size_t)n;
  }
  if (!buf[0]) snprintf(buf, len, "-");
}

static void print_agents(const json_t *agents) {
  static const char *const headers[COLUMNS] = {"NAME",  "HOST", "POOL",  "ADDRESS",
                                               "CORES", "GPUS", "STATE", "LAST SEEN"};
  static const size_t max_cols[COLUMNS] = {40, 40, 24, 40, 6, 48, 7, 12};
  size_t rows = json_array_size(agents);
  const char **cells = calloc(rows * COLUMNS + 1, sizeof *cells);
  char(*text)[COLUMNS][CLI_CELL_BYTES] = calloc(rows + 1, sizeof *text);
  if (!cells || !text) {
    cli_fail("out of memory");
  } else {
    for (size_t r = 0; r < rows; r++) {
      const json_t *a = json_array_get(agents, r);
      static const char *const keys[5] = {"name", "hostname", "pool", "address", "cpus"};
      for (int c = 0; c < 5; c++)
        cli_format_value(json_object_get(a, keys[c]), text[r][c], CLI_CELL_BYTES);
      format_gpus(json_object_get(a, "gpus"), text[r][5], CLI_CELL_BYTES);
      cli_format_value(json_object_get(a, "state"), text[r][6], CLI_CELL_BYTES);
      format_ago(cli_string_at(a, "last_seen_time"), text[r][7], CLI_CELL_BYTES);
      for (int c = 0; c < COLUMNS; c++) cells[r * COLUMNS + (size_t)c] = text[r][c];
    }
    cli_print_table(headers, max_cols, COLUMNS, cells, (int)rows);
  }
  free(cells);
  free(text);
}

static int agents_ls(cli_client *client, const cli_options *opts) {
  json_t *all = NULL;
  int exit_code = cli_list_all(client, "/v1/agents", "agents", &all);
  if (exit_code == CLI_EXIT_OK && opts->output == CLI_OUTPUT_JSON) {
    json_t *wrapper = json_pack("{s:O}", "agents", all);
    cli_print_json(wrapper);
    json_decref(wrapper);
  } else if (exit_code == CLI_EXIT_OK && json_array_size(all) == 0) {
    printf("no kiln-agent has registered\n");
  } else if (exit_code == CLI_EXIT_OK) {
    print_agents(all);
  }
  json_decref(all);
  return exit_code;
}

static int agents_get(cli_client *client, const cli_options *opts, const char *name) {
  if (!*name) return cli_usage_error("an agent name or id is needed");
  char *escaped = cli_url_escape(name);
  char *path = escaped ? cli_printf("/v1/agents/%s", escaped) : NULL;
  free(escaped);
  if (!path) return cli_fail("out of memory");
  json_t *agent = NULL;
  int exit_code = cli_call_api(client, "GET", path, NULL, 0, &agent);
  free(path);
  if (exit_code != CLI_EXIT_OK) return exit_code;
  if (opts->output == CLI_OUTPUT_JSON) {
    cli_print_json(agent);
  } else {
    json_t *one = json_pack("[O]", agent);
    print_agents(one);
    json_decref(one);
    size_t i;
    json_t *g;
    json_array_foreach(json_object_get(agent, "gpus"), i, g) {
      char memory[CLI_CELL_BYTES];
      cli_format_value(json_object_get(g, "memory_bytes"), memory, sizeof memory);
      const char *gpu_name = cli_string_at(g, "name");
      printf("gpu %lld: ", (long long)json_integer_value(json_object_get(g, "index")));
      if (gpu_name && *gpu_name) {
        cli_put_clean(stdout, gpu_name);
        printf(", ");
      }
      printf("%s bytes\n", memory);
    }
    printf("id: ");
    cli_put_clean(stdout, cli_string_at(agent, "id") ? cli_string_at(agent, "id") : "-");
    printf("\nversion: ");
    const char *version = cli_string_at(agent, "version");
    cli_put_clean(stdout, version && *version ? version : "-");
    printf("\nregistered: ");
    cli_put_clean(stdout,
                  cli_string_at(agent, "create_time") ? cli_string_at(agent, "create_time") : "-");
    printf("\n");
  }
  json_decref(agent);
  return CLI_EXIT_OK;
}

int cli_cmd_agents(cli_client *client, const cli_options *opts) {
  const char *verb = opts->n_args ? opts->args[0] : "ls";
  if (strcmp(verb, "ls") == 0 && opts->n_args <= 1) return agents_ls(client, opts);
  if (strcmp(verb, "get") == 0 && opts->n_args == 2) return agents_get(client, opts, opts->args[1]);
  return cli_usage_error("agents takes 'ls' (or nothing) or 'get NAME'");
}
