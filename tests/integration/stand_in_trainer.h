/* stand_in_trainer.h — a shell script that speaks kiln-train's progress
 * protocol in milliseconds, for the integration suites that need jobs with
 * a known plan, steps, metrics and checkpoints rather than real training. */
#ifndef KILN_TESTS_STAND_IN_TRAINER_H
#define KILN_TESTS_STAND_IN_TRAINER_H

/* The stand-in trainer. "sleeper*" jobs run until signalled. "steps*" jobs
 * report the plan kiln-train reports (2 epochs of 10 steps), then steps 1
 * to 20, each with its loss (100 - step, so the newest is lowest) and, on
 * even steps, val_loss ((step - 8)^2 + 1: lowest at step 8) and a
 * checkpoint whose file holds its step (and whose sha256 is the file's); given --resume FILE they
 * go on after that step. "steps-slow" jobs take 0.1 s a step; every job writes its pid to
 * CKPT_DIR/pid. "steps-profiled" jobs leave a profile table and trace where kiln-train writes them.
 */
static const char it_stand_in_trainer[] =
    "#!/bin/sh\n"
    "spec=\"$2\"; resume=''; ckdir=''; prev=''\n"
    "for a in \"$@\"; do\n"
    "  [ \"$prev\" = --resume ] && resume=\"$a\"\n"
    "  [ \"$prev\" = --checkpoint-dir ] && ckdir=\"$a\"\n"
    "  prev=\"$a\"\n"
    "done\n"
    "if grep -q '\"display_name\":\"sleeper' \"$spec\"; then exec sleep 600; fi\n"
    "echo $$ > \"$ckdir/pid\"\n"
    "echo '{\"status\":{\"phase\":\"training\",\"message\":\"training steps on data: 160 "
    "examples, 2 epochs of 10 steps\"}}' >&3\n"
    "i=1\n"
    "if [ -n \"$resume\" ]; then i=$(( $(cat \"$resume\") + 1 )); fi\n"
    "while [ $i -le 20 ]; do\n"
    "  if grep -q 'steps-slow' \"$spec\"; then sleep 0.1; fi\n"
    "  e=$(( (i - 1) / 10 + 1 ))\n"
    "  echo \"{\\\"step\\\":$i,\\\"epoch\\\":$e,\\\"metrics\\\":{\\\"loss\\\":$((100 - i))}}\" "
    ">&3\n"
    "  if [ $((i % 2)) -eq 0 ]; then\n"
    "    v=$(( (i - 8) * (i - 8) + 1 ))\n"
    "    echo \"{\\\"step\\\":$i,\\\"epoch\\\":$e,\\\"metrics\\\":{\\\"val_loss\\\":$v}}\" >&3\n"
    "    f=\"$ckdir/ckpt-$i.safetensors\"; echo $i > \"$f\"\n"
    "    h=$(sha256sum \"$f\" | cut -d' ' -f1); b=$(wc -c < \"$f\")\n"
    "    echo \"{\\\"checkpoint\\\":{\\\"step\\\":$i,\\\"path\\\":\\\"$f\\\",\\\"bytes\\\":$b,"
    "\\\"sha256\\\":\\\"$h\\\"}}\" >&3\n"
    "  fi\n"
    "  i=$((i+1))\n"
    "done\n"
    "if grep -q 'steps-profiled' \"$spec\"; then\n"
    "  printf 'node          ms\\nmatmul/dense  1.50\\n' > \"$ckdir/profile.txt\"\n"
    "  echo '{\"traceEvents\":[]}' > \"$ckdir/profile.json\"\n"
    "fi\n";

#endif
