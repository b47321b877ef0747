// The Flink test's job (tests/tests/flink.rs), built by the test with the
// JDK's javac and jar against the cluster's own flink-dist (no Maven here).
//
//   OrcaNumbers <output directory> continuous   0, 1, 2, ... for ever
//   OrcaNumbers <output directory> bounded <n>  0 .. n-1, then finishes
//   OrcaNumbers <output directory> fail         fails at the 50th number
//
// Each number is a line of a file of the output directory. The file sink
// commits its files on checkpoints and savepoints (exactly once), and the
// source's position is in its state: a job stopped with a savepoint and
// run again from it writes each number once, with no gap.
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.MapFunction;
import org.apache.flink.api.common.serialization.SimpleStringEncoder;
import org.apache.flink.api.connector.source.lib.NumberSequenceSource;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.RestartStrategyOptions;
import org.apache.flink.connector.file.sink.FileSink;
import org.apache.flink.streaming.api.functions.sink.filesystem.rollingpolicies.OnCheckpointRollingPolicy;
import org.apache.flink.core.fs.Path;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;

public class OrcaNumbers {
    public static void main(String[] args) throws Exception {
        String out = args[0];
        String mode = args.length > 1 ? args[1] : "continuous";
        long last = mode.equals("bounded") ? Long.parseLong(args[2]) - 1 : Long.MAX_VALUE;
        final boolean fail = mode.equals("fail");
        Configuration conf = new Configuration();
        // With checkpoints on, Flink restarts a failing job for ever by
        // default; the failing mode fails it for good at once.
        if (fail) {
            conf.set(RestartStrategyOptions.RESTART_STRATEGY, "none");
        }
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment(conf);
        env.enableCheckpointing(1000);
        env.setParallelism(1);
        env.fromSource(new NumberSequenceSource(0, last), WatermarkStrategy.noWatermarks(), "numbers")
            .map(new MapFunction<Long, String>() {
                @Override
                public String map(Long n) throws Exception {
                    if (fail && n == 50) {
                        throw new IllegalStateException("probe: the job was asked to fail at " + n);
                    }
                    // About 200 numbers a second: a pause lands mid-stream.
                    Thread.sleep(5);
                    return Long.toString(n);
                }
            })
            // A file per checkpoint: what a checkpoint or savepoint commits
            // is visible at once.
            .sinkTo(FileSink.forRowFormat(new Path(out), new SimpleStringEncoder<String>("UTF-8"))
                .withRollingPolicy(OnCheckpointRollingPolicy.build())
                .build());
        env.execute("orca-numbers-" + mode);
    }
}
