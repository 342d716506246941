/* kilnd_backup.h — kilnd's `backup` and `restore` commands (kilnd_backup.c),
 * run by main() when they are its first argument; each returns kilnd's exit
 * status, having printed what it did or why not. */
#ifndef KILN_KILND_BACKUP_H
#define KILN_KILND_BACKUP_H

/* `kilnd backup [--data-dir DIR] OUT` (DIR defaults to default_data_dir). */
int kilnd_backup_command(int argc, char **argv, const char *default_data_dir);
/* `kilnd restore OUT --data-dir DIR`. */
int kilnd_restore_command(int argc, char **argv);

#endif
