package mview.delta;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.util.Iterator;

import io.delta.storage.HadoopFileSystemLogStore;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FSDataOutputStreamBuilder;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

/**
 * Delta's log store for object stores whose Hadoop file system can create a file only if it is absent, in one
 * request: Hadoop S3A (3.5 and later) with {@code fs.option.create.conditional.overwrite}, which puts the object
 * with {@code If-None-Match: *}. A commit {@code _delta_log/<version>.json} written without overwrite is created
 * by exactly one writer, whichever process or machine it runs in, Spark or delta-rs (which commits the same
 * way); a writer that loses the race gets {@link FileAlreadyExistsException}, which Delta turns into its
 * optimistic retry (a conflict check against the winner's commit, then the next version). The object appears
 * whole or not at all, so a partial commit is never visible. Checkpoints and {@code _last_checkpoint}, written
 * with overwrite, are plain puts.
 */
public class ConditionalPutLogStore extends HadoopFileSystemLogStore {
    static final String CONDITIONAL = "fs.option.create.conditional.overwrite";

    public ConditionalPutLogStore(Configuration hadoopConf) {
        super(hadoopConf);
    }

    @Override
    public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
            throws IOException {
        StringBuilder text = new StringBuilder();
        while (actions.hasNext()) {
            text.append(actions.next()).append('\n');
        }
        byte[] bytes = text.toString().getBytes(StandardCharsets.UTF_8); // all of it before the one request
        FileSystem fs = path.getFileSystem(hadoopConf);
        FSDataOutputStreamBuilder<?, ?> builder = fs.createFile(path).overwrite(overwrite);
        if (!overwrite) {
            builder = (FSDataOutputStreamBuilder<?, ?>) builder.must(CONDITIONAL, true);
        }
        try (FSDataOutputStream out = builder.build()) {
            out.write(bytes); // the put happens at close: 412 when another writer created the version first
        } catch (IOException e) {
            if (!overwrite && preconditionFailed(e)) {
                throw lost(path, e);
            }
            throw e;
        }
    }

    private static FileAlreadyExistsException lost(Path path, Throwable cause) {
        FileAlreadyExistsException e = new FileAlreadyExistsException(path.toString());
        e.initCause(cause);
        return e;
    }

    /** S3A reports a failed precondition as RemoteFileChangedException (status 412), possibly wrapped. */
    private static boolean preconditionFailed(Throwable e) {
        for (Throwable t = e; t != null; t = t.getCause()) {
            if (t.getClass().getSimpleName().equals("RemoteFileChangedException")
                    || t instanceof org.apache.hadoop.fs.FileAlreadyExistsException
                    || (t.getMessage() != null && t.getMessage().contains("412"))) {
                return true;
            }
        }
        return false;
    }

    @Override
    public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
        return false;
    }
}
