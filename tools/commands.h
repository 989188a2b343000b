/* commands.h: the subcommands of the `loom` tool, each in its own cmd_<name>.c. Each takes the
 * arguments after its name (argv[0] is the first of them) and returns the process exit code:
 * 0 success, 1 failure at run time, 2 bad usage. */
#ifndef LOOM_TOOLS_COMMANDS_H
#define LOOM_TOOLS_COMMANDS_H

int cmd_bench(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_plot(int argc, char **argv);
int cmd_train(int argc, char **argv);

#endif
